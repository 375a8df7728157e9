"""The CPU's GEMM on SmolLM2-135M's layer shapes: ``F.linear`` on the plain weight (the plain linear
method) against oneDNN on a weight packed once (``onednn_gemm``, layers/cpu_gemm.py), per batch size;
in bf16 on a CPU with AVX512-BF16 and no AMX, also against ``cpu_vec_gemm``'s op on its own packing
(layers/cpu_vec_gemm.py), which the engine runs there instead of oneDNN.

    python benchmarks/cpu_gemm.py [--dtype float32] [--rows 1 8 32 64 256] [--threads 2]

Each shape multiplies ``--weights`` different weights in turn (so that they do not all stay in the
cache, as in a forward); the median of ``--repeats`` calls is printed, and packed / plain (and vec / plain).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from tracevllm.layers import cpu_vec_gemm
from tracevllm.layers.cpu_gemm import onednn_linear, pack_for_onednn

# [out, in] of SmolLM2-135M's linear layers (hidden 576, 9 + 2 x 3 heads of 64, MLP 1536, vocab 49152).
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", type=int, default=8, help="weights per shape (the LM head: one)")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    vec = cpu_vec_gemm.applies(dtype) and cpu_vec_gemm.load()
    print(f"{args.dtype}, {args.threads} threads; ms for {args.weights} weights of each shape: plain, packed (ratio)"
          + (", vec (ratio)" if vec else ""))
    with torch.inference_mode():
        for rows in args.rows:
            cells = [f"rows {rows:4d}"]
            for name, (out_features, in_features) in SHAPES.items():
                count = 1 if name == "lm_head" else args.weights
                weights = [torch.randn(out_features, in_features).to(dtype) for _ in range(count)]
                packed = [pack_for_onednn(w) for w in weights]
                x = torch.randn(rows, in_features).to(dtype)
                plain = median_ms(lambda: [F.linear(x, w) for w in weights], args.repeats)
                fast = median_ms(lambda: [onednn_linear(x, p) for p in packed], args.repeats)
                cell = f"{name} {plain:.3f} {fast:.3f} ({fast / plain:.2f})"
                if vec:
                    packed = [cpu_vec_gemm.pack_linear(w) for w in weights]
                    ours = median_ms(lambda: [cpu_vec_gemm.vec_linear(x, p, out_features) for p in packed],
                                     args.repeats)
                    cell += f" {ours:.3f} ({ours / plain:.2f})"
                cells.append(cell)
            print("  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
