"""``tracevllm/whatif/config.py``: ``--set`` values typed as ``EngineArgs`` types them, and a KV cache
that keeps the recorded memory unless told otherwise."""

from __future__ import annotations

import pytest

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.whatif.config import SimulationConfig, parse_settings

RECORDED = SimulationConfig(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512, max_model_len=1024),
                        CacheConfig(block_size=16, num_gpu_blocks=1000), kv_bytes_per_token=2048.0)


def test_values_take_their_engine_args_types():
    assert parse_settings(["max_num_seqs=8", "enable-prefix-caching=off", "block_size=32",
                           "scheduling_policy=priority", "long_prefill_token_threshold=64"]) == {
        "max_num_seqs": 8, "enable_prefix_caching": False, "block_size": 32, "scheduling_policy": "priority",
        "long_prefill_token_threshold": 64}


def test_the_kv_cache_keeps_the_recorded_memory():
    assert RECORDED.with_settings({}).cache.num_gpu_blocks == 1000
    assert RECORDED.with_settings({"block_size": 32}).cache.num_gpu_blocks == 500
    assert RECORDED.with_settings({"kv_cache_memory_bytes": 2048 * 16 * 100}).cache.num_gpu_blocks == 100
    assert RECORDED.with_settings({"num_gpu_blocks_override": 70, "block_size": 32}).cache.num_gpu_blocks == 70
    with pytest.raises(ValueError, match="fewer than max_model_len .* add --set max_model_len=144 or "
                                         "--set num_gpu_blocks_override=65"):
        RECORDED.with_settings({"num_gpu_blocks_override": 10})
    without_bytes = SimulationConfig(RECORDED.scheduler, RECORDED.cache)
    with pytest.raises(ValueError, match="set num_gpu_blocks_override instead"):
        without_bytes.with_settings({"kv_cache_memory_bytes": 10**9})


def test_the_engine_checks_the_result():
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= max_num_seqs"):
        RECORDED.with_settings({"max_num_seqs": 1024})
    with pytest.raises(ValueError, match="With chunked prefill off, max_num_batched_tokens must be >= max_model_len"):
        RECORDED.with_settings({"enable_chunked_prefill": False})
    assert RECORDED.with_settings({"enable_chunked_prefill": False, "max_num_batched_tokens": 1024}).scheduler.\
        enable_chunked_prefill is False


@pytest.mark.parametrize("settings, add", [
    ({"max_num_batched_tokens": 32}, "The recorded run had max_num_seqs=64: add --set max_num_seqs=32."),
    ({"max_num_seqs": 1024}, "The recorded run had max_num_batched_tokens=512: add --set max_num_batched_tokens=1024."),
    ({"enable_chunked_prefill": False}, "add --set max_num_batched_tokens=1024."),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 600}, "add --set max_model_len=600."),
])
def test_a_setting_that_breaks_a_pair_names_the_set_to_add(settings, add):
    """The engine checks max_num_batched_tokens against max_num_seqs (and, with chunked prefill off,
    max_model_len); --set of one of them alone says which other --set makes them fit, and that one does."""
    with pytest.raises(ValueError) as error:
        RECORDED.with_settings(settings)
    assert str(error.value).endswith(add)
    key, value = add.split("--set ")[1].rstrip(".").split("=")
    RECORDED.with_settings({**settings, **parse_settings([f"{key}={value}"])})


def test_both_of_a_pair_set_gets_only_the_engines_message():
    with pytest.raises(ValueError, match=r"must be >= max_num_seqs \(64\), got 32\.$"):
        RECORDED.with_settings({"max_num_batched_tokens": 32, "max_num_seqs": 64})
