"""Optimisation "cpu_paged_decode": decode attention read in place from the paged KV cache, on CPU.

The plain torch backend gathers every decode row's keys and values out of the cache blocks into a
padded copy and runs SDPA on the copy (``TorchAttentionImpl._decode``): at long contexts it reads
the context three times (gather in, gather out, SDPA) and runs SDPA's flash kernel on queries of
one row. ``cpu_paged_decode.cpp`` reads each row's K/V once, through its block table, where it lies,
as vLLM's CPU backend and every GPU paged-attention kernel do. No Python route measured
(Inductor, flex_attention, numba; docs/perf-log.md) read the cache in place faster than gather + SDPA.

The op is built the first time a CPU engine loads a model with the switch on (``cpu_extension.py``).
"""

from __future__ import annotations

import torch

from tracevllm.attention.ops import cpu_extension


def load() -> bool:
    """Build (once per machine) and load the op; False, with a warning, where it cannot be built."""
    return cpu_extension.load("cpu_paged_decode")


def supports(head_dim: int) -> bool:
    """Whether the op handles this head size: it is compiled for powers of two from 16 to 256."""
    return head_dim in (16, 32, 64, 128, 256)


def paged_decode_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                           rows: torch.Tensor, tokens: torch.Tensor, scale: float, sliding_window: int | None) -> None:
    """``out[tokens[i]]`` = attention of ``query[tokens[i]]`` (one decode token) over the keys of
    request ``rows[i]``: positions ``0 .. seq_lens[rows[i]] - 1`` (the last ``sliding_window`` of
    them, with a window), read in place from ``key_cache``/``value_cache`` through ``block_table``.

    Shapes as ``AttentionImpl.forward``'s: query and out ``[num_tokens, num_heads, head_dim]``, the
    caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, ``block_table`` and ``seq_lens``
    int32; ``rows`` and ``tokens`` int64. Softmax and sums in float32, whatever the cache dtype."""
    torch.ops.tracevllm.paged_decode_attention(out, query, key_cache, value_cache, block_table, seq_lens,
                                               rows, tokens, scale, sliding_window or 0)
