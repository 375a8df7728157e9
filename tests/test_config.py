"""The configs check their own values when they are built (tracevllm/config.py): a bad value is a
ValueError naming the option and what it may be, however the config is built. No model is loaded."""

from __future__ import annotations

from typing import get_args

import pytest

from tracevllm.config import (
    BlockSize, CacheConfig, ObservabilityConfig, ParallelConfig, SchedulerConfig, SchedulerPolicy, TraceLevel,
)


@pytest.mark.parametrize("build, match", [
    (lambda: CacheConfig(block_size=3), r"block_size must be one of \[1, 2, 4, 8, 16, 32, 64, 128\], got 3"),
    (lambda: CacheConfig(gpu_memory_utilization=1.5), r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
    (lambda: CacheConfig(num_gpu_blocks_override=0), "num_gpu_blocks_override must be >= 1, got 0"),
    (lambda: SchedulerConfig(max_num_seqs=0), "max_num_seqs must be >= 1, got 0"),
    (lambda: SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4),
     r"max_num_batched_tokens must be >= max_num_seqs \(8\), got 4"),
    (lambda: SchedulerConfig(max_num_batched_tokens=512, max_model_len=1024, enable_chunked_prefill=False),
     r"With chunked prefill off, max_num_batched_tokens must be >= max_model_len \(1024\), got 512"),
    (lambda: SchedulerConfig(policy="lifo"), r"scheduling_policy must be one of \['fcfs', 'priority'\], got 'lifo'"),
    (lambda: ObservabilityConfig(trace_level="span"), r"trace_level must be one of \['request', 'step'\]"),
    (lambda: ParallelConfig(2, distributed_executor_backend="threads"),
     r"distributed_executor_backend must be one of \['uni', 'mp', 'ray'\], got 'threads'"),
])
def test_a_bad_value_is_a_value_error_naming_the_option(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_every_choice_of_a_literal_is_accepted():
    for block_size in get_args(BlockSize):
        CacheConfig(block_size=block_size)
    for policy in get_args(SchedulerPolicy):
        SchedulerConfig(policy=policy)
    for level in get_args(TraceLevel):
        ObservabilityConfig(trace_level=level)
