"""KV-cache blocks, the free-block queue, and the block hashes behind prefix caching.

A block holds the KV of ``block_size`` consecutive tokens of one sequence. A *full* block can be
found again by its hash, which chains the parent block's hash with the block's own token ids::

    hash(block i) = sha256(hash(block i-1), tokens of block i)

so equal hashes mean equal whole prefixes, not just equal blocks. Hashes are sha256 over a msgpack
encoding, stable across processes and runs (Python's ``hash()`` is salted per process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

BlockHash = bytes
_ROOT_HASH: BlockHash = b"tracevllm-prefix-root"


def hash_block_tokens(parent_block_hash: BlockHash | None, curr_block_token_ids: Sequence[int]) -> BlockHash:
    parent = _ROOT_HASH if parent_block_hash is None else parent_block_hash
    return hashlib.sha256(msgspec.msgpack.encode((parent, list(curr_block_token_ids)))).digest()


def hash_request_tokens(block_size: int, token_ids: Sequence[int]) -> list[BlockHash]:
    """Hashes of a request's full blocks of ``token_ids`` (its prompt; later also generated tokens)."""
    return hash_new_full_blocks(block_size, token_ids, [])


def hash_new_full_blocks(block_size: int, token_ids: Sequence[int], block_hashes: list[BlockHash]) -> list[BlockHash]:
    """Extend ``block_hashes`` (in place and returned) to cover every full block of ``token_ids``."""
    parent = block_hashes[-1] if block_hashes else None
    for start in range(len(block_hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        block_hashes.append(parent)
    return block_hashes


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One physical block. ``ref_cnt`` counts the running requests using it; a block with
    ``ref_cnt == 0`` is in the free queue, and may still hold a cached prefix (``block_hash``)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    prev_free_block: "KVCacheBlock | None" = None
    next_free_block: "KVCacheBlock | None" = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeKVCacheBlockQueue:
    """The free blocks, as a doubly linked list between two sentinels, in the order they are handed out.

    The head goes first. ``BlockPool.free_blocks`` decides where a freed block joins: a block whose
    KV nobody can find again (no cached hash) at the head, to be reused first; a cached block at the
    tail, so the cached blocks are evicted least recently freed first. A prefix-cache hit takes a
    cached block out of the *middle* of the list, which the links make O(1) (a deque would make it O(n)).
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        chain = [self.head, *blocks, self.tail]
        for prev, nxt in zip(chain, chain[1:]):
            prev.next_free_block, nxt.prev_free_block = nxt, prev

    def popleft(self) -> KVCacheBlock:
        if self.num_free_blocks == 0:
            raise ValueError("No free blocks available.")
        block = self.head.next_free_block
        assert block is not None
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        assert prev is not None and nxt is not None, f"{block} is not in the free queue"
        prev.next_free_block, nxt.prev_free_block = nxt, prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev_free_block
        assert last is not None
        last.next_free_block, block.prev_free_block = block, last
        block.next_free_block, self.tail.prev_free_block = self.tail, block
        self.num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, in their order: the first of them is handed out next."""
        for block in reversed(blocks):
            first = self.head.next_free_block
            assert first is not None
            self.head.next_free_block, block.prev_free_block = block, self.head
            block.next_free_block, first.prev_free_block = first, block
            self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        blocks, block = [], self.head.next_free_block
        while block is not None and block is not self.tail:
            blocks.append(block)
            block = block.next_free_block
        return blocks
