"""A decoder layer's element-wise chains three ways, side by side: the plain PyTorch code, torch.compile
(optimisation "compiled_norm_act", layers/compiled.py) and the C++ ops (optimisation "cpu_norm_act",
layers/cpu_norm_act.py); microseconds a call, the median of ``--repeat`` timings, per batch size.

    python benchmarks/norm_act.py --dtype bfloat16 --tokens 1 16 128 512 2048

The shapes are the bundled model's (SmolLM2-135M: hidden 576, intermediate 1536, 9 heads and 3 KV
heads of 64); ``--hidden`` and friends change them. The first compiled call of each function is
timed apart: that is the one-time cost a process pays.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from tracevllm.layers import cpu_norm_act
from tracevllm.layers.activation import silu_and_mul
from tracevllm.layers.compiled import compiled
from tracevllm.layers.layernorm import rms_norm
from tracevllm.layers.rotary_embedding import rotate


def median_us(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 512, 2048])
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    if not cpu_norm_act.load():
        raise SystemExit("the C++ ops could not be built")
    print(f"C++ ops built or loaded in {time.perf_counter() - start:.1f} s; torch threads {torch.get_num_threads()}")
    q_width, kv_width = args.heads * args.head_dim, args.kv_heads * args.head_dim
    first_compile: dict[str, float] = {}
    print(f"{'tokens':>6} {'chain':<10} {'plain us':>9} {'compiled':>9} {'C++':>9} {'plain/C++':>9} {'compiled/C++':>12}")
    for tokens in args.tokens:
        x = torch.randn(tokens, args.hidden, dtype=dtype)
        residual = torch.randn(tokens, args.hidden, dtype=dtype)
        weight = torch.randn(args.hidden, dtype=dtype)
        gate_up = torch.randn(tokens, 2 * args.intermediate, dtype=dtype)
        qkv = torch.randn(tokens, q_width + 2 * kv_width, dtype=dtype)
        q, k = qkv[:, :q_width], qkv[:, q_width:q_width + kv_width]
        cos = torch.randn(tokens, 1, args.head_dim).to(dtype)
        sin = torch.randn(tokens, 1, args.head_dim).to(dtype)
        chains = {
            "rms_norm": (rms_norm, cpu_norm_act.rms_norm, (x, weight, 1e-5, residual)),
            "silu_mul": (silu_and_mul, cpu_norm_act.silu_and_mul, (gate_up,)),
            "rope": (rotate, cpu_norm_act.rotate, (q, k, cos, sin, args.head_dim)),
        }
        for name, (plain, cpp, fn_args) in chains.items():
            if name not in first_compile:
                start = time.perf_counter()
                compiled(plain)(*fn_args)
                first_compile[name] = time.perf_counter() - start
            times = [median_us(lambda f=f: f(*fn_args), args.repeat) for f in (plain, compiled(plain), cpp)]
            print(f"{tokens:>6} {name:<10} {times[0]:>9.1f} {times[1]:>9.1f} {times[2]:>9.1f} "
                  f"{times[0] / times[2]:>9.2f} {times[1] / times[2]:>12.2f}")
    print("first compiled call (torch.compile, in this process): "
          + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in first_compile.items()))


if __name__ == "__main__":
    main()
