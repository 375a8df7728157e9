"""Optimisation "cpu_amx_prefill": prefill attention on AMX tiles, on CPUs that have them (bf16).

The plain torch backend runs each prefill through SDPA (``TorchAttentionImpl._prefill``), whose
CPU flash kernel, in bf16, masks causality in blocks of 512 keys and calls a full oneDNN GEMM for
every block pair: at 1,024 tokens a causal prefill costs it about as much as a non-causal one
(docs/perf-log.md). ``cpu_amx_prefill.cpp`` is a flash attention on 64 x 64 blocks whose two matrix
products run on the CPU's AMX tiles through torch's own micro-kernel (``cpublas::brgemm``), and
which skips every block the causal mask hides. It reads K and V through the block table from the
paged cache, so a chunk with a context needs no gathered copy either.

It needs bf16 and AMX (Intel Sapphire Rapids and later). On a CPU with AVX512-BF16 but no AMX (AMD
Zen 4, Intel Cooper Lake), optimisation "cpu_vec_prefill" runs the same op with its two products on
AVX512-BF16 dot-product instructions (``dot_product_gemm``, 16 float32 lanes an instruction) in place
of the tiles. Elsewhere SDPA stays. The op is built the first time a CPU engine loads a model with
either switch on (``cpu_extension.py``).
"""

from __future__ import annotations

import torch

from tracevllm.attention.ops import cpu_extension


def load() -> bool:
    """Build (once per machine) and load the op; False, with a warning, where it cannot be built."""
    return cpu_extension.load("cpu_amx_prefill")


def supports(head_dim: int, dtype: torch.dtype, amx: bool = True) -> bool:
    """Whether the op handles this model, with its products on AMX tiles (``amx``) or on AVX512-BF16
    dot products: bf16, a CPU with those instructions, head size a multiple of 64 up to 256."""
    cpu = getattr(torch, "cpu", None)
    if dtype != torch.bfloat16 or head_dim not in (64, 128, 192, 256) or cpu is None:
        return False
    return cpu._is_amx_tile_supported() if amx else cpu._is_avx512_bf16_supported()


def prefill_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_table: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                      rows: torch.Tensor, scale: float, sliding_window: int | None, amx: bool = True) -> None:
    """For each request ``r`` in ``rows``: ``out[query_start_loc[r]:query_start_loc[r + 1]]`` = causal
    attention of those query tokens, the last ones of the request's ``seq_lens[r]`` positions, over
    its keys (the last ``sliding_window`` before each token, with a window), read from
    ``key_cache``/``value_cache`` through ``block_table``, which must already hold this step's keys.

    Shapes as ``AttentionImpl.forward``'s: query and out ``[num_tokens, num_heads, head_dim]``, the
    caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, ``block_table``, ``query_start_loc``
    and ``seq_lens`` int32; ``rows`` int64. All bf16; softmax and sums in float32. The products run on
    AMX tiles with ``amx``, else on AVX512-BF16 dot products (``supports`` says where each can)."""
    torch.ops.tracevllm.prefill_attention(out, query, key_cache, value_cache, block_table, query_start_loc,
                                          seq_lens, rows, scale, sliding_window or 0, amx)
