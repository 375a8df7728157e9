"""Does a one-time cost land in a request? A fresh process's first step of ``--min-tokens`` or more
scheduled tokens against the median of the later steps of the same size, from a ``--trace-out``
directory recorded at step level; and the start-up's phases and one-time costs.

    tracevllm bench throughput --workload mixed --num-prompts 16 --warmup short \\
        --max-num-batched-tokens 256 --trace-out /tmp/first
    python benchmarks/first_step.py /tmp/first

A ratio near 1 means the first large step paid nothing extra; a compile inside it (a torch.compile
in the forward) shows as a ratio of several, and as the step's ``step.one_time_costs``.
"""

from __future__ import annotations

import argparse
import statistics

from viz.trace_loader import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--min-tokens", type=int, default=128)
    args = parser.parse_args()
    trace = load_trace(args.trace_dir)
    large = [s for s in trace.steps if s.num_scheduled_tokens >= args.min_tokens]
    if not large:
        raise SystemExit(f"no step of {args.min_tokens} tokens or more")
    first = large[0]
    same = [s.end - s.start for s in large[1:] if s.num_scheduled_tokens == first.num_scheduled_tokens]
    print(f"{len(trace.steps)} steps; the first of {args.min_tokens}+ tokens: step {first.number}, "
          f"{first.num_scheduled_tokens} tokens, {(first.end - first.start) * 1e3:.1f} ms"
          + (f"; it paid {', '.join(f'{w} {s:.1f} s' for w, s in first.one_time_costs)}" if first.one_time_costs else ""))
    if same:
        median = statistics.median(same)
        print(f"the median of the {len(same)} later steps of {first.num_scheduled_tokens} tokens: {median * 1e3:.1f} ms; "
              f"first / median {(first.end - first.start) / median:.2f}")
    else:
        print(f"no later step of {first.num_scheduled_tokens} tokens to compare with")


if __name__ == "__main__":
    main()
