"""Decode attention on CPU: the bf16 op this CPU has (``cpu_amx_decode`` on AMX tiles, or ``cpu_vec_decode``
on AVX512-BF16 dot products) against ``cpu_paged_decode``, as the cpu backend calls each.

``python benchmarks/cpu_decode.py`` times a decode step's worth of attention: for each of
``--layers`` layers (distinct caches, so that they come from memory as in a forward), ``--num-seqs``
decode rows whose contexts are ``--context`` keys long (or drawn from ``--context LO:HI``), read
in place from a paged cache through shuffled block tables. Both ops take the same arguments; their
outputs are checked against each other first. The two are timed in turns, ``--rounds`` times, and
the medians printed: ms per layer, ns per key, and the rate at which the cache is read. bf16 only,
on a CPU with AMX tiles or AVX512-BF16 (``--op`` picks one where there are both).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tracevllm.attention.ops import cpu_amx_decode, cpu_paged_decode, cpu_vec_decode

BF16_OPS = {"cpu_amx_decode": (cpu_amx_decode, cpu_amx_decode.amx_decode_attention),
            "cpu_vec_decode": (cpu_vec_decode, cpu_vec_decode.vec_decode_attention)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-seqs", type=int, default=40)
    parser.add_argument("--context", default="1000", help="keys per row, or LO:HI for lengths drawn uniformly")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--shape", default="9:3:64", help="heads:kv_heads:head_dim (default: SmolLM2-135M)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--op", choices=list(BF16_OPS), help="default: the first this CPU and shape allow")
    args = parser.parse_args(argv)
    heads, kv_heads, head_dim = (int(x) for x in args.shape.split(":"))
    allowed = [name for name, (module, _) in BF16_OPS.items()
               if module.supports(heads, kv_heads, head_dim, torch.bfloat16)
               and (name != "cpu_amx_decode" or args.block_size % 16 == 0)]
    bf16_op = args.op or (allowed[0] if allowed else None)
    if bf16_op not in allowed:
        parser.error("no bf16 decode op for this CPU and shape: cpu_amx_decode needs AMX tiles and a block size "
                     "that is a multiple of 16, cpu_vec_decode AVX512-BF16; both a head_dim of 64-256 and at most "
                     "16 heads per KV head")
    if not (BF16_OPS[bf16_op][0].load() and cpu_paged_decode.load()):
        parser.error("the ops did not build (a C++ compiler and ninja are needed)")

    torch.manual_seed(0)
    n, bs = args.num_seqs, args.block_size
    lo, _, hi = args.context.partition(":")
    seq_lens = torch.randint(int(lo), int(hi or lo) + 1, (n,), dtype=torch.int32)
    blocks_per_seq = -(-int(seq_lens.max()) // bs)
    keys = int(seq_lens.sum())
    block_table = torch.randperm(n * blocks_per_seq).int().view(n, blocks_per_seq)
    rows = torch.arange(n)
    scale = head_dim ** -0.5
    layers = []
    for _ in range(args.layers):
        query = torch.randn(n, heads, head_dim, dtype=torch.bfloat16)
        caches = [torch.randn(n * blocks_per_seq, bs, kv_heads, head_dim, dtype=torch.bfloat16) for _ in range(2)]
        layers.append((query, *caches))

    def run(op, query, key_cache, value_cache):
        out = torch.empty_like(query)
        op(out, query, key_cache, value_cache, block_table, seq_lens, rows, rows, scale, None)
        return out

    ops = {bf16_op: BF16_OPS[bf16_op][1], "cpu_paged_decode": cpu_paged_decode.paged_decode_attention}
    torch.testing.assert_close(run(ops[bf16_op], *layers[0]), run(ops["cpu_paged_decode"], *layers[0]),
                               atol=2e-2, rtol=2e-2)
    print(f"{n} decode rows, {args.context} keys each ({keys:,} in all), {args.layers} layers, heads {args.shape}, "
          f"block size {bs}, bf16, {torch.get_num_threads()} threads")
    runs: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(args.rounds + 1):  # the first round warms up and is dropped
        for name, op in ops.items():
            start = time.perf_counter()
            for layer in layers:
                run(op, *layer)
            runs[name].append((time.perf_counter() - start) / args.layers)
    bytes_read = 2 * keys * kv_heads * head_dim * 2  # K and V, bf16
    times = {name: statistics.median(r[1:]) for name, r in runs.items()}
    for name, t in times.items():
        print(f"{name}: {t * 1e3:.3f} ms per layer, {t / keys * 1e9:.1f} ns per key, "
              f"cache read at {bytes_read / t / 1e9:.1f} GB/s")
    print(f"cpu_paged_decode / {bf16_op}: {times['cpu_paged_decode'] / times[bf16_op]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
