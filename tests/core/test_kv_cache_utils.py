"""FreeKVCacheBlockQueue and block hashing."""

from __future__ import annotations

from tracevllm.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    hash_block_tokens,
    hash_new_full_blocks,
    hash_request_tokens,
)
from tracevllm.request import Request
from tracevllm.sampling_params import SamplingParams


def ids(blocks):
    return [b.block_id for b in blocks]


def test_free_queue_order_and_o1_removal():
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks)
    assert q.num_free_blocks == 6 and ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]
    q.remove(blocks[3])  # from the middle, as on a prefix hit
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 4, 5]
    assert blocks[3].prev_free_block is None and blocks[3].next_free_block is None
    assert ids([q.popleft()]) == [0]
    assert ids(q.popleft_n(2)) == [1, 2]
    q.append(blocks[0])
    q.append_n([blocks[3], blocks[1]])
    assert ids(q.get_all_free_blocks()) == [4, 5, 0, 3, 1] and q.num_free_blocks == 5
    q.remove(blocks[1])  # the tail
    q.remove(blocks[4])  # the head
    assert ids(q.get_all_free_blocks()) == [5, 0, 3]
    q.popleft_n(3)
    assert q.num_free_blocks == 0 and q.get_all_free_blocks() == []


def test_hash_chains_parent_and_tokens():
    a = hash_block_tokens(None, [1, 2, 3, 4])
    assert a == hash_block_tokens(None, [1, 2, 3, 4])
    assert a != hash_block_tokens(None, [1, 2, 3, 5])
    b = hash_block_tokens(a, [5, 6, 7, 8])
    assert b != hash_block_tokens(None, [5, 6, 7, 8])  # same tokens, other prefix
    assert b != hash_block_tokens(hash_block_tokens(None, [0, 2, 3, 4]), [5, 6, 7, 8])


def test_request_hashes_cover_full_blocks_only_and_extend():
    request = Request("r", list(range(10)), SamplingParams(), 2, 0.0)
    hashes = hash_request_tokens(4, request.all_token_ids)
    assert len(hashes) == 2
    assert hashes[1] == hash_block_tokens(hash_block_tokens(None, [0, 1, 2, 3]), [4, 5, 6, 7])
    request.append_output_token_ids([10, 11])
    hash_new_full_blocks(4, request.all_token_ids, request.block_hashes or hashes)
    assert len(hashes) == 3 and hashes[2] == hash_block_tokens(hashes[1], [8, 9, 10, 11])
