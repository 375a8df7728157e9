"""Prefill attention on CPU: the ``cpu_amx_prefill`` op against SDPA, as the cpu backend calls each.

``python benchmarks/cpu_prefill.py`` times a forward's worth of prefill attention: for
each of ``--layers`` layers (distinct caches, so that they come from memory as in a forward),
``--num-seqs`` prompts of ``--prompt-len`` tokens, no cached context. The op attends them all in
one call, reading K/V from a paged cache through shuffled block tables; SDPA runs once per prompt
on the same K/V as they lie in the step (``is_causal``, GQA), as ``TorchAttentionImpl._prefill``
does. Both outputs are checked against each other first. Medians, in ms per 1,000 prompt tokens.
bf16 only. ``--products amx`` (on a CPU with AMX tiles) or ``vec`` (AVX512-BF16 dot products,
optimisation "cpu_vec_prefill"); by default, each that this CPU has.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from tracevllm.attention.ops import cpu_amx_prefill


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-seqs", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--shape", default="9:3:64", help="heads:kv_heads:head_dim (default: SmolLM2-135M)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--products", choices=["amx", "vec"], nargs="+", default=["amx", "vec"],
                        help="the op's matrix products on AMX tiles and/or AVX512-BF16 dot products")
    args = parser.parse_args(argv)
    heads, kv_heads, head_dim = (int(x) for x in args.shape.split(":"))
    products = [p for p in args.products if cpu_amx_prefill.supports(head_dim, torch.bfloat16, amx=p == "amx")]
    if not products:
        parser.error("the op needs bf16 instructions (AMX tiles or AVX512-BF16) and a head_dim of 64, 128, 192 or 256")
    if not cpu_amx_prefill.load():
        parser.error("the op did not build (a C++ compiler and ninja are needed)")

    torch.manual_seed(0)
    n, length, bs = args.num_seqs, args.prompt_len, args.block_size
    tokens, blocks_per_seq = n * length, -(-length // bs)
    scale = head_dim ** -0.5
    block_table = torch.randperm(n * blocks_per_seq).int().view(n, blocks_per_seq)
    query_start_loc = torch.arange(0, tokens + 1, length, dtype=torch.int32)
    seq_lens = torch.full((n,), length, dtype=torch.int32)
    rows = torch.arange(n)
    slots = (block_table.long().unsqueeze(-1) * bs + torch.arange(bs)).flatten(1)[:, :length].flatten()
    layers = []
    for _ in range(args.layers):
        query = torch.randn(tokens, heads, head_dim, dtype=torch.bfloat16)
        key, value = (torch.randn(tokens, kv_heads, head_dim, dtype=torch.bfloat16) for _ in range(2))
        caches = [torch.zeros(n * blocks_per_seq, bs, kv_heads, head_dim, dtype=torch.bfloat16) for _ in range(2)]
        for cache, new in zip(caches, (key, value)):
            cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, new)
        layers.append((query, key, value, *caches))

    def op(amx: bool):
        def run(query, key, value, key_cache, value_cache):
            out = torch.empty_like(query)
            cpu_amx_prefill.prefill_attention(out, query, key_cache, value_cache, block_table, query_start_loc,
                                              seq_lens, rows, scale, None, amx=amx)
            return out
        return run

    def sdpa(query, key, value, key_cache, value_cache):
        out = torch.empty_like(query)
        for i in range(n):
            span = slice(i * length, (i + 1) * length)
            q, k, v = (t[span].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
            out[span] = o.squeeze(0).transpose(0, 1)
        return out

    ops = {f"op, products on {p}": op(p == "amx") for p in products}
    for fn in ops.values():
        torch.testing.assert_close(fn(*layers[0]), sdpa(*layers[0]), atol=2e-2, rtol=2e-2)
    print(f"{n} prompts of {length} tokens, {args.layers} layers, heads {args.shape}, bf16, "
          f"{torch.get_num_threads()} threads")
    times = {}
    for name, fn in (*ops.items(), ("SDPA", sdpa)):
        runs = []
        for _ in range(args.iters + 1):
            start = time.perf_counter()
            for layer in layers:
                fn(*layer)
            runs.append(time.perf_counter() - start)
        times[name] = statistics.median(runs[1:]) * 1e3 * 1000 / tokens
        print(f"{name}: {times[name]:.1f} ms per 1,000 prompt tokens")
    for name in ops:
        print(f"SDPA / {name}: {times['SDPA'] / times[name]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
