"""What the sampler costs a decode step: the operators it runs (on a GPU, each one that is not a view
or an allocation is a kernel launch) and its time on this CPU, for greedy rows and for random rows
with each draw.

    python benchmarks/sampler_draws.py [--vocab 49152] [--batch-sizes 1 48] [--repeats 200]

A decode step of a small model on a GPU is bound by the host's launches (docs/perf.md, issue 33), so
the launch count is what sampling costs there; on a CPU the passes over the vocabulary count. The
cases: ``greedy`` (temperature 0), ``random, plain`` (temperature 1; softmax, cumulative sum, search:
the draw on CUDA) and ``random, two_level`` (optimisation two_level_sampling: the draw on a CPU).
Each is ``Sampler.forward`` on float32 logits, with no filter, penalty, logprob or seeded row.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracevllm.benchmarks.compare import machine_line
from tracevllm.sample.metadata import SamplingMetadata
from tracevllm.sample.ops.topk_topp_sampler import sample_from_softmax, two_level_sampling
from tracevllm.sample.sampler import Sampler

CASES = {"greedy": (0.0, sample_from_softmax), "random, plain": (1.0, sample_from_softmax),
         "random, two_level": (1.0, two_level_sampling)}
# Allocations, and the 0-dim host scalar a Python number becomes (a kernel takes it as an argument).
NO_KERNEL = {"empty", "empty_like", "empty_strided", "scalar_tensor"}


class CountOps(TorchDispatchMode):
    """Counts the operators dispatched inside it: those that would launch a kernel, and the others
    (views, allocations, host scalars)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: Counter[str] = Counter()
        self.others = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if func.is_view or name in NO_KERNEL:
            self.others += 1
        else:
            self.kernels[name] += 1
        return func(*args, **(kwargs or {}))


def metadata(batch: int, temperature: float) -> SamplingMetadata:
    greedy = temperature == 0.0
    return SamplingMetadata(
        temperature=None if greedy else torch.full((batch,), temperature), all_greedy=greedy,
        all_random=not greedy, top_p=None, top_k=None, max_top_k=0, min_p=None, generators={},
        max_num_logprobs=None, no_penalties=True, presence_penalties=None, frequency_penalties=None,
        repetition_penalties=None, prompt_token_ids=None, output_token_ids=[], min_tokens={})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=49152, help="SmolLM2's vocabulary by default")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 48])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(machine_line(), f"torch threads {torch.get_num_threads()}")
    for batch in args.batch_sizes:
        logits = torch.randn(batch, args.vocab) * 3
        print(f"\nbatch {batch}, vocabulary {args.vocab}")
        print(f"{'rows':18} {'kernels':>7} {'other':>5}  {'CPU µs, median':>14}  operators")
        for name, (temperature, draw) in CASES.items():
            sampler, md = Sampler(draw), metadata(batch, temperature)
            with CountOps() as ops:
                sampler(logits, md)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                sampler(logits, md)
                times.append(time.perf_counter() - start)
            kernels = sum(ops.kernels.values())
            listing = " ".join(f"{op}x{n}" if n > 1 else op for op, n in ops.kernels.items())
            print(f"{name:18} {kernels:7d} {ops.others:5d}  {statistics.median(times) * 1e6:14.1f}  {listing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
