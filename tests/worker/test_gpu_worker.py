"""gpu_kv_cache_budget: vLLM's gpu_memory_utilization rule for sizing the KV cache on CUDA."""

from __future__ import annotations

import pytest

from tracevllm.worker.gpu_worker import gpu_kv_cache_budget

GiB = 2**30


def test_the_kv_cache_gets_what_the_model_leaves_of_the_share():
    # 80 GiB GPU, the model holds 2 GiB: at 0.5 the engine may use 40 GiB, 38 of them for the KV cache.
    assert gpu_kv_cache_budget(80 * GiB, 78 * GiB, 2 * GiB, 0.5) == 38 * GiB
    assert gpu_kv_cache_budget(80 * GiB, 78 * GiB, 2 * GiB, 0.9) == int(80 * GiB * 0.9) - 2 * GiB


def test_a_share_other_processes_hold_is_a_value_error():
    with pytest.raises(ValueError, match="other processes"):
        gpu_kv_cache_budget(80 * GiB, 20 * GiB, 2 * GiB, 0.9)  # 60 GiB used by someone else


def test_a_share_the_model_fills_is_a_value_error():
    with pytest.raises(ValueError, match="leaves nothing for the KV cache"):
        gpu_kv_cache_budget(80 * GiB, 78 * GiB, 2 * GiB, 0.02)
