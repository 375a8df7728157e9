"""BlockPool: the null block, allocation, ref counts, caching, and where freed blocks rejoin the queue."""

from __future__ import annotations

import pytest

from tracevllm.core.block_pool import NULL_BLOCK_ID, BlockPool
from tracevllm.core.kv_cache_utils import hash_block_tokens


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_block_0_is_the_null_block_never_handed_out():
    pool = BlockPool(5, enable_caching=True)
    assert NULL_BLOCK_ID == 0 and free_ids(pool) == [1, 2, 3, 4]
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    assert all(b.ref_cnt == 1 for b in blocks)
    # Usage counts the blocks that can hold KV: 3 of 4 are in use.
    assert pool.get_num_free_blocks() == 1 and pool.get_usage() == pytest.approx(0.75)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)


def test_touch_and_free_with_sharing():
    pool = BlockPool(5, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.touch(blocks)  # a second request shares them
    assert [b.ref_cnt for b in blocks] == [2, 2]
    pool.free_blocks(blocks)
    assert pool.get_num_free_blocks() == 2  # still held by the other request
    pool.free_blocks(list(reversed(blocks)))
    # Uncached blocks go back to the head, in the order given: they are reused first.
    assert free_ids(pool) == [2, 1, 3, 4]


def test_freed_uncached_blocks_are_reused_before_cached_ones_are_evicted():
    """vLLM's free queue: a block nobody can find again goes to the head, a cached one to the tail."""
    pool = BlockPool(6, enable_caching=True)
    blocks = pool.get_new_blocks(4)  # 1, 2, 3, 4
    pool.cache_full_blocks("r", blocks, [hash_block_tokens(None, [i]) for i in range(2)], 0, 2)  # 1, 2 cached
    pool.free_blocks(list(reversed(blocks)))  # a request's blocks, last first: 4, 3, 2, 1
    assert free_ids(pool) == [4, 3, 5, 2, 1]
    assert [b.block_id for b in pool.get_new_blocks(3)] == [4, 3, 5]  # no cached block evicted yet


def test_without_prefix_caching_every_freed_block_goes_to_the_head():
    pool = BlockPool(4, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(list(reversed(blocks)))
    assert free_ids(pool) == [2, 1, 3]


def test_cached_blocks_stay_findable_until_evicted_lru():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    hashes = [hash_block_tokens(None, [i]) for i in range(3)]
    pool.cache_full_blocks("r", blocks, hashes, 0, 3)
    pool.free_blocks([blocks[1], blocks[0], blocks[2]])  # eviction order: 1, 0, 2
    assert all(pool.get_cached_block(h) is b for h, b in zip(hashes, blocks))
    # A hit on a free cached block takes it out of the free queue.
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 1 and pool.get_num_free_blocks() == 2
    new = pool.get_new_blocks(1)
    assert new == [blocks[1]]  # the least recently freed block is evicted first
    assert pool.get_cached_block(hashes[1]) is None and blocks[1].block_hash is None
    assert pool.get_cached_block(hashes[2]) is blocks[2]


def test_two_blocks_of_one_hash_stay_findable_until_both_are_evicted():
    """Two requests computed the same block at once: the first stored is found first, and the
    second is still found once the first is evicted (vLLM's BlockHashToBlockMap)."""
    pool = BlockPool(4, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    h = hash_block_tokens(None, [7])
    pool.cache_full_blocks("r1", [a], [h], 0, 1)
    pool.cache_full_blocks("r2", [b], [h], 0, 1)
    assert pool.get_cached_block(h) is a
    pool.free_blocks([a, b])
    pool.get_new_blocks(2)  # 3, then a: evicted
    assert pool.get_cached_block(h) is b
    pool.get_new_blocks(1)
    assert pool.get_cached_block(h) is None


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(3, enable_caching=True)
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks("r", blocks, [hash_block_tokens(None, [1])], 0, 1)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(hash_block_tokens(None, [1])) is None
