"""BlockPool: every KV block, the free queue, and the map from block hash to cached block."""

from __future__ import annotations

from collections.abc import Iterable

from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import AllBlocksCleared, BlocksEvicted, BlocksStored
from tracevllm.core.kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock

# Block 0 is vLLM's null block: never handed out, never free. It stands for "no block" in a block
# table (the padding a kernel may read and never uses), so that no request's KV is ever there.
NULL_BLOCK_ID = 0


class BlockPool:
    """Owns all ``num_gpu_blocks`` blocks. Block ids are indices into the KV cache tensors; block 0 is
    the null block (``NULL_BLOCK_ID``), so ``num_gpu_blocks - 1`` blocks hold requests' KV.

    A cached block stays findable (in ``cached_block_hash_to_block``) while it sits in the free
    queue, until ``get_new_blocks`` hands it out again: that is its eviction. Two requests that
    compute the same block at once give two blocks one hash: both are findable, the first stored
    first, as in vLLM's ``BlockHashToBlockMap``. The pool records the changes to the prefix cache
    (stored, evicted, cleared), as vLLM's BlockPool queues its KV cache events; who holds which block
    is the KV cache manager's to record.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, recorder: EventRecorder | None = None) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.recorder = recorder or EventRecorder()
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[NULL_BLOCK_ID + 1:])
        # hash -> the blocks cached under it, by id, in the order they were stored
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        blocks = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def cache_full_blocks(self, request_id: str, blocks: list[KVCacheBlock], block_hashes: list[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` (of ``request_id``) under their hashes."""
        stored: list[KVCacheBlock] = []
        for block, block_hash in zip(blocks[num_cached_blocks:num_full_blocks],
                                     block_hashes[num_cached_blocks:num_full_blocks]):
            if block.block_hash is not None:
                continue  # a prefix hit: already cached
            block.block_hash = block_hash
            self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block
            stored.append(block)
        if stored and self.recorder.enabled:
            self.recorder.record(BlocksStored(request_id, [b.block_id for b in stored],
                                            [b.block_hash for b in stored]))  # type: ignore[misc]

    def get_new_blocks(self, num_blocks: int, request_id: str = "") -> list[KVCacheBlock]:
        """Take blocks from the head of the free queue for ``request_id``, evicting cached ones."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool.")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        evicted = [block.block_id for block in blocks if self._evict(block)]
        for block in blocks:
            block.ref_cnt = 1
        if evicted and self.recorder.enabled:
            self.recorder.record(BlocksEvicted(evicted, request_id))
        return blocks

    def _evict(self, block: KVCacheBlock) -> bool:
        """Forget the block's hash; False if it had none."""
        if block.block_hash is None:
            return False
        cached = self.cached_block_hash_to_block[block.block_hash]
        del cached[block.block_id]
        if not cached:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
        return True

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """A prefix hit: the blocks gain a user; a free one leaves the free queue (O(1))."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one user of each block, ``ordered_blocks`` in the order they should be reused. A block
        left unused goes back to the free queue: to its head when its KV can never be found again (no
        cached hash, or prefix caching off), to be reused before any cached block is evicted; to its
        tail when it is cached, so that cached blocks are evicted least recently freed first (vLLM's
        ``BlockPool.free_blocks``)."""
        reuse_first, evict_last = [], []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"{block} freed twice"
            if block.ref_cnt == 0:
                (evict_last if self.enable_caching and block.block_hash is not None else reuse_first).append(block)
        self.free_block_queue.prepend_n(reuse_first)
        self.free_block_queue.append_n(evict_last)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use."""
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        if self.recorder.enabled:
            self.recorder.record(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """The share of the blocks that can hold KV (all but the null block) that are in use."""
        usable = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / usable if usable else 0.0
