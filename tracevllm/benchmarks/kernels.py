"""``tracevllm bench kernels``: the Triton paged-attention kernel against SDPA on gathered K/V.

Decode (one query token per sequence, ``--batch-sizes`` x ``--context-lens``) is memory-bound: its
figure is the achieved bandwidth, the K and V bytes it must read divided by its time, next to the
device's measured copy bandwidth (``dst.copy_(src)`` of 1 GiB: read + write bytes / time). Prefill
(one sequence of ``--prefill-lens`` tokens, no cached context) is compute-bound: its figure is
TFLOP/s, counting the causal half of ``4 * L^2 * heads * head_dim``.

The baseline is what the torch backend does on a GPU: gather each sequence's K/V from the paged
cache through its block table (``index_select``) and run ``scaled_dot_product_attention``, timed
together (after checking that both give the same output). Shapes are ``heads:kv_heads:head_dim`` (SmolLM2's 9:3:64 and Llama-3-8B's 32:8:128 by
default). Times are medians; on a CPU the kernel runs under Triton's interpreter (set
``TRITON_INTERPRET=1``), which is for checking the script, not for measuring.

torch is imported inside the functions that run, so that building the ``tracevllm`` command line
(``--help``) does not load it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _shapes(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in s.split(":")) for s in text.split(",")]  # type: ignore[misc]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", type=_shapes, default=_shapes("9:3:64,32:8:128"),
                        help="heads:kv_heads:head_dim, comma-separated")
    parser.add_argument("--batch-sizes", type=_ints, default=_ints("1,8,32,128"))
    parser.add_argument("--context-lens", type=_ints, default=_ints("512,1024,4096,8192"))
    parser.add_argument("--prefill-lens", type=_ints, default=_ints("512,2048,4096"))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default=None, help="a torch device (default: cuda if torch sees one, else cpu)")


def _median_seconds(fn, device: torch.device, iters: int) -> float:
    """On CUDA, ``triton.testing.do_bench``'s median (CUDA events, L2 flushed before each call, so
    small caches are read from memory, not from L2); on a CPU, wall-clock medians of ``iters`` calls."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median") / 1e3

    fn()  # compile / warm up
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, iters: int) -> float:
    """GB/s of ``dst.copy_(src)`` on 1 GiB (64 MiB on a CPU), counting bytes read and written."""
    import torch

    numel = (1 << 30 if device.type == "cuda" else 1 << 26) // 2
    src = torch.empty(numel, dtype=torch.float16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / _median_seconds(lambda: dst.copy_(src), device, iters) / 1e9


def _paged_batch(num_seqs: int, seq_len: int, query_len: int, shape, block_size: int, dtype, device):
    """Random queries and a paged cache holding ``num_seqs`` sequences of ``seq_len`` tokens in
    shuffled blocks; the last ``query_len`` tokens of each are the queries."""
    import torch

    from tracevllm.attention.backends.abstract import AttentionMetadata

    num_heads, num_kv_heads, head_dim = shape
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    value_cache = torch.randn(cache_shape, dtype=dtype, device=device)
    block_table = torch.randperm(num_blocks, device=device).to(torch.int32).view(num_seqs, blocks_per_seq)
    query = torch.randn(num_seqs * query_len, num_heads, head_dim, dtype=dtype, device=device)
    query_start_loc = torch.arange(0, num_seqs + 1, dtype=torch.int32) * query_len
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32)
    md = AttentionMetadata(
        num_actual_tokens=query.shape[0], max_query_len=query_len, max_seq_len=seq_len,
        query_start_loc=query_start_loc.to(device), seq_lens=seq_lens.to(device), block_table=block_table,
        slot_mapping=torch.empty(0, dtype=torch.int64, device=device),
        query_start_loc_cpu=query_start_loc.numpy(), seq_lens_cpu=seq_lens.numpy(),
    )
    return query, key_cache, value_cache, md


def _triton_fn(query, key_cache, value_cache, md, split_kv: bool | None = None):
    """The kernel as the backend calls it; ``split_kv`` None lets ``use_split_kv`` decide."""
    import torch

    from tracevllm.attention.ops.triton_unified_attention import unified_attention

    out = torch.empty_like(query)
    scale = query.shape[-1] ** -0.5

    def run():
        unified_attention(query, key_cache, value_cache, out, md.query_start_loc, md.seq_lens, md.block_table,
                          md.num_actual_tokens, md.max_query_len, md.max_seq_len, scale, split_kv=split_kv)
        return out

    return run


def _sdpa_fn(query, key_cache, value_cache, md):
    """Gather every sequence's K/V through its block table, then one SDPA call for the batch (all
    sequences have the same length here, so no padding is needed)."""
    import torch
    import torch.nn.functional as F

    num_seqs, seq_len = md.num_reqs, md.max_seq_len
    num_kv_heads, head_dim = key_cache.shape[2:]
    block_size = key_cache.shape[1]
    positions = torch.arange(seq_len, device=query.device)
    slots = (md.block_table[:, positions // block_size].long() * block_size + positions % block_size).flatten()
    flat_k, flat_v = key_cache.view(-1, num_kv_heads, head_dim), value_cache.view(-1, num_kv_heads, head_dim)
    q = query.view(num_seqs, -1, *query.shape[1:]).transpose(1, 2)  # [seqs, heads, q_len, D]
    causal = md.max_query_len > 1

    def run():
        k = flat_k.index_select(0, slots).view(num_seqs, seq_len, num_kv_heads, head_dim).transpose(1, 2)
        v = flat_v.index_select(0, slots).view(num_seqs, seq_len, num_kv_heads, head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2).reshape(query.shape)  # back to [tokens, heads, D]

    return run


def _timed_pair(inputs, device: torch.device, iters: int) -> tuple[float, float]:
    """Median seconds of the Triton kernel and of the baseline, after checking they agree."""
    import torch

    triton_fn, sdpa_fn = _triton_fn(*inputs), _sdpa_fn(*inputs)
    torch.testing.assert_close(triton_fn().float(), sdpa_fn().float(), atol=2e-2, rtol=2e-2)
    return _median_seconds(triton_fn, device, iters), _median_seconds(sdpa_fn, device, iters)


def run_kernels(args: argparse.Namespace) -> int:
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth(device, args.iters)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, dtype {args.dtype}, block size {args.block_size}, copy bandwidth {bandwidth:.0f} GB/s")
    print("decode: shape, batch, context -> triton GB/s (% of copy) with split-KV as use_split_kv "
          "chooses, sdpa-on-gathered GB/s, speed-up; then split-KV forced off and on")
    for shape in args.shapes:
        for batch in args.batch_sizes:
            for context in args.context_lens:
                inputs = _paged_batch(batch, context, 1, shape, args.block_size, dtype, device)
                kv_bytes = 2 * inputs[1].element_size() * batch * context * shape[1] * shape[2]
                t_triton, t_sdpa = _timed_pair(inputs, device, args.iters)
                forced = [kv_bytes / _median_seconds(_triton_fn(*inputs, split_kv=on), device, args.iters) / 1e9
                          for on in (False, True)]
                gbs = kv_bytes / t_triton / 1e9
                print(f"  {':'.join(map(str, shape))} B={batch} L={context}: {gbs:.0f} GB/s "
                      f"({100 * gbs / bandwidth:.0f} %), sdpa {kv_bytes / t_sdpa / 1e9:.0f} GB/s, "
                      f"{t_sdpa / t_triton:.2f}x; split-KV off {forced[0]:.0f}, on {forced[1]:.0f} GB/s")
    print("prefill: shape, length -> triton TFLOP/s, sdpa-on-gathered TFLOP/s, speed-up")
    for shape in args.shapes:
        for length in args.prefill_lens:
            inputs = _paged_batch(1, length, length, shape, args.block_size, dtype, device)
            flops = 2 * length * length * shape[0] * shape[2]  # 4 L^2 H D, halved by the causal mask
            t_triton, t_sdpa = _timed_pair(inputs, device, args.iters)
            print(f"  {':'.join(map(str, shape))} L={length}: {flops / t_triton / 1e12:.1f} TFLOP/s, "
                  f"sdpa {flops / t_sdpa / 1e12:.1f} TFLOP/s, {t_sdpa / t_triton:.2f}x")
    return 0
