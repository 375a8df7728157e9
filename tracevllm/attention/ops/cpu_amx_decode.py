"""Optimisation "cpu_amx_decode": decode attention on AMX tiles, on CPUs that have them (bf16).

``cpu_paged_decode.cpp`` reads each decode row's K/V in place from the paged cache, but computes on
float32 vector registers: per key and query head, a 64-dim dot product and a 64-dim weighted add,
after converting every key and value to float32. At long contexts that arithmetic, not memory, set
its pace (docs/perf-log.md). ``cpu_amx_decode.cpp`` reads the same cache in the same place and hands
both products to the tile unit: ``K Q^T`` straight from the cache rows, ``P V`` after pairing the
step's values, as vLLM's CPU backend does on AMX (vLLM also re-lays its cache out for the tiles;
ours stays as it is).

It needs AMX (Intel Sapphire Rapids and later), bf16, a block size that is a multiple of 16, a head
size of 64, 128, 192 or 256 and at most 16 query heads per KV head; elsewhere the float32 op (or
the plain path) stays. The op is built the first time a CPU engine loads a model with
the switch on (``cpu_extension.py``).
"""

from __future__ import annotations

import torch

from tracevllm.attention.ops import cpu_extension


def load() -> bool:
    """Build (once per machine) and load the op; False, with a warning, where it cannot be built."""
    return cpu_extension.load("cpu_amx_decode", ("-mamx-tile", "-mamx-bf16", "-mavx512bf16"))


def supports(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the op handles this model (the block size is checked per call): see the module docstring."""
    cpu = getattr(torch, "cpu", None)
    return (dtype == torch.bfloat16 and head_dim in (64, 128, 192, 256) and num_heads // num_kv_heads <= 16
            and cpu is not None and cpu._is_amx_tile_supported()
            and torch.backends.cpu.get_cpu_capability().startswith("AVX512"))


def amx_decode_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                         rows: torch.Tensor, tokens: torch.Tensor, scale: float, sliding_window: int | None) -> None:
    """What ``cpu_paged_decode.paged_decode_attention`` computes, with the same arguments, on AMX tiles:
    probabilities rounded to bf16 before ``P V``, softmax and sums in float32."""
    torch.ops.tracevllm.amx_decode_attention(out, query, key_cache, value_cache, block_table, seq_lens,
                                             rows, tokens, scale, sliding_window or 0)
