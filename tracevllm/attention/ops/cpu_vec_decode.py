"""Optimisation "cpu_vec_decode": decode attention on AVX512-BF16 dot products, on CPUs that have them
but no AMX tiles (AMD Zen 4, Zen 5), in bf16.

``cpu_paged_decode.cpp`` reads each decode row's K/V in place from the paged cache, but widens every
key and value to float32 and multiplies in float32: per key and query head a 64-dim dot product and
a 64-dim weighted add, at the pace of that arithmetic, not of memory. ``cpu_vec_decode.cpp`` reads
the same cache in the same place and multiplies the bf16 rows as they lie on ``vdpbf16ps``, 32 dims
an instruction for the scores and, with the values paired, 16 dims of two keys an instruction for
``P V``: what ``cpu_amx_decode`` does on the tile unit, on the vector units
(docs/perf-log.md#avx512-bf16-decode-attention).

It needs AVX512-BF16, bf16, a head size of 64, 128, 192 or 256 and at most 16 query heads per KV
head; any block size. Where AMX tiles are there too, ``cpu_amx_decode`` comes first. The op is
built the first time a CPU engine loads a model with the switch on (``cpu_extension.py``).
"""

from __future__ import annotations

import torch

from tracevllm.attention.ops import cpu_extension


def load() -> bool:
    """Build (once per machine) and load the op; False, with a warning, where it cannot be built."""
    return cpu_extension.load("cpu_vec_decode", ("-mavx512bf16",))


def supports(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the op handles this model on this CPU: see the module docstring."""
    cpu = getattr(torch, "cpu", None)
    return (dtype == torch.bfloat16 and head_dim in (64, 128, 192, 256) and num_heads // num_kv_heads <= 16
            and cpu is not None and cpu._is_avx512_bf16_supported()
            and torch.backends.cpu.get_cpu_capability().startswith("AVX512"))


def vec_decode_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                         rows: torch.Tensor, tokens: torch.Tensor, scale: float, sliding_window: int | None) -> None:
    """What ``cpu_paged_decode.paged_decode_attention`` computes, with the same arguments, on
    AVX512-BF16 dot products: probabilities rounded to bf16 before ``P V``, softmax and sums in float32."""
    torch.ops.tracevllm.vec_decode_attention(out, query, key_cache, value_cache, block_table, seq_lens,
                                             rows, tokens, scale, sliding_window or 0)
