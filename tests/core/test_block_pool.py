"""BlockPool: allocation, ref counts, caching and LRU eviction."""

from __future__ import annotations

import pytest

from tracevllm.core.block_pool import BlockPool
from tracevllm.core.kv_cache_utils import hash_block_tokens


def test_get_new_blocks_takes_the_head_and_sets_ref_counts():
    pool = BlockPool(5, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.get_num_free_blocks() == 2 and pool.get_usage() == pytest.approx(0.6)
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)


def test_touch_and_free_with_sharing():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.touch(blocks)  # a second request shares them
    assert [b.ref_cnt for b in blocks] == [2, 2]
    pool.free_blocks(blocks)
    assert pool.get_num_free_blocks() == 2  # still held by the other request
    pool.free_blocks(list(reversed(blocks)))
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [2, 3, 1, 0]


def test_cached_blocks_stay_findable_until_evicted_lru():
    pool = BlockPool(3, enable_caching=True)
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


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(2, enable_caching=True)
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks("r", blocks, [hash_block_tokens(None, [1])], 0, 1)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(hash_block_tokens(None, [1])) is None
