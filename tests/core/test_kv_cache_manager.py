"""KVCacheManager: prefix hits, allocation, freeing, and stats (in the spirit of vLLM's test_prefix_caching)."""

from __future__ import annotations

import pytest

from tracevllm.core.kv_cache_manager import KVCacheManager
from tracevllm.core.kv_cache_utils import hash_request_tokens
from tracevllm.request import Request
from tracevllm.sampling_params import SamplingParams

BS = 4


def make_request(req_id: str, tokens: list[int]) -> Request:
    request = Request(req_id, tokens, SamplingParams(), 2, 0.0)
    request.block_hashes = hash_request_tokens(BS, request.all_token_ids)
    return request


def schedule(manager: KVCacheManager, request: Request) -> list[int]:
    """What the scheduler does for a waiting request; returns the new block ids."""
    hit, num_hit = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - num_hit, num_hit, hit)
    assert new is not None
    request.num_computed_tokens = request.num_tokens
    return new.get_block_ids()


def test_prefix_hit_full_blocks_and_never_the_last_token():
    m = KVCacheManager(num_gpu_blocks=10, block_size=BS, max_model_len=64)
    a = make_request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert schedule(m, a) == [1, 2, 3]  # block 0 is the null block
    b = make_request("b", list(range(10)) + [99])
    hit, num_hit = m.get_computed_blocks(b)
    assert hit.get_block_ids() == [1, 2] and num_hit == 8
    c = make_request("c", list(range(8)))  # exactly the two cached blocks
    hit, num_hit = m.get_computed_blocks(c)
    assert hit.get_block_ids() == [1] and num_hit == 4  # the last token must be recomputed
    d = make_request("d", [7] + list(range(1, 10)))
    assert m.get_computed_blocks(d)[1] == 0


def test_shared_blocks_ref_counts_and_free_returns_everything():
    m = KVCacheManager(num_gpu_blocks=8, block_size=BS, max_model_len=64)
    a, b = make_request("a", list(range(9))), make_request("b", list(range(8)) + [50, 51])
    schedule(m, a)
    assert schedule(m, b) == [4]  # blocks 1 and 2 shared, one new block
    assert m.get_block_ids("b") == [1, 2, 4]
    assert [m.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    m.free(a)
    assert m.num_free_blocks == (8 - 1) - 3  # all but the null block and b's
    m.free(b)
    assert m.num_free_blocks == 8 - 1 and m.usage == 0.0
    # Freed last-block-first, a's then b's: the partial tail blocks (no hash, so never found again) go
    # to the head, reused first; the shared cached prefix to the tail, evicted last, its last block first.
    assert [blk.block_id for blk in m.block_pool.free_block_queue.get_all_free_blocks()] == [4, 3, 5, 6, 7, 2, 1]


def test_allocate_returns_none_and_changes_nothing_when_full():
    m = KVCacheManager(num_gpu_blocks=4, block_size=BS, max_model_len=64)
    a = make_request("a", list(range(12)))
    schedule(m, a)
    b = make_request("b", list(range(100, 110)))
    free_before = m.num_free_blocks
    assert m.allocate_slots(b, 10) is None
    assert m.num_free_blocks == free_before and m.get_block_ids("b") == []


def test_free_cached_hit_blocks_are_not_counted_as_available():
    m = KVCacheManager(num_gpu_blocks=4, block_size=BS, max_model_len=64)  # 3 blocks and the null block
    a = make_request("a", list(range(9)))
    schedule(m, a)
    m.free(a)  # 3 free blocks, two of them cached
    b = make_request("b", list(range(8)) + [40, 41, 42, 43, 44])  # hits 2 blocks, needs 2 more
    hit, num_hit = m.get_computed_blocks(b)
    assert num_hit == 8
    assert m.allocate_slots(b, b.num_tokens - num_hit, num_hit, hit) is None
    assert m.num_free_blocks == 3


def test_decode_fills_blocks_that_later_requests_hit():
    m = KVCacheManager(num_gpu_blocks=8, block_size=BS, max_model_len=64)
    a = make_request("a", list(range(6)))
    schedule(m, a)
    for token in (6, 7, 8):  # generated tokens complete block 1
        a.append_output_token_ids(token)
        assert m.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    m.free(a)
    b = make_request("b", list(range(9)) + [77])
    assert m.get_computed_blocks(b)[1] == 8


def test_eviction_drops_the_hash():
    m = KVCacheManager(num_gpu_blocks=3, block_size=BS, max_model_len=64)  # 2 blocks and the null block
    a = make_request("a", list(range(8)) + [1])
    m.allocate_slots(a, 8)
    m.free(a)
    b = make_request("b", list(range(200, 208)))
    schedule(m, b)  # takes both free blocks: a's cached blocks are evicted
    again = make_request("again", list(range(8)) + [1])
    assert m.get_computed_blocks(again)[1] == 0


def test_caching_disabled_never_hits():
    m = KVCacheManager(num_gpu_blocks=8, block_size=BS, max_model_len=64, enable_caching=False)
    a = make_request("a", list(range(9)))
    schedule(m, a)
    assert m.get_computed_blocks(make_request("b", list(range(9)) + [3]))[1] == 0


def test_prefix_cache_stats():
    m = KVCacheManager(num_gpu_blocks=8, block_size=BS, max_model_len=64)
    schedule(m, make_request("a", list(range(9))))
    schedule(m, make_request("b", list(range(9))))
    stats = m.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 18, 8)
    assert stats.hit_rate == pytest.approx(8 / 18)
    assert m.make_prefix_cache_stats().queries == 0  # reset on read
