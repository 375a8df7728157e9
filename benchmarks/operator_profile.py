"""What one decode step (or the prefill) costs, operator by operator, in tracevllm or in vLLM, on the
same model and batch.

    python benchmarks/operator_profile.py [--engine tracevllm|vllm] [--model DIR] [--dtype bfloat16]
        [--phase decode|prefill] [--num-seqs 48] [--prompt-len 160] [--steps 20] [--top 25]

Run as a file by either engine's python (vLLM's venv need not have tracevllm), so this file imports
only the standard library at the top and the engine inside ``main``; vLLM runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` unless set) so that its
operators are in the profile, with tracevllm's 1 GiB KV budget.

The same batch of random prompts goes through twice, each time new prompts (no prefix-cache hits):
to one output token (the prefill step alone) and to ``1 + steps`` tokens. What the second costs
beyond the first, divided by ``steps``, is one decode step at contexts of ``prompt_len`` to
``prompt_len + steps`` tokens: first as wall time without the profiler, then per operator from
``torch.profiler`` (self CPU time, and calls per step). With ``--phase prefill`` only the first
kind of run is measured, and the figures are per 1,000 prompt tokens. docs/perf-log.md puts the two
engines' tables side by side.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["tracevllm", "vllm"], default="tracevllm")
    parser.add_argument("--model", default=None, help="a Hugging Face directory (tracevllm: default, the bundled model)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--phase", choices=["decode", "prefill"], default="decode")
    parser.add_argument("--num-seqs", type=int, default=48)
    parser.add_argument("--prompt-len", type=int, default=160)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="operators to list")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.engine == "vllm" and args.model is None:
        parser.error("--engine vllm needs --model DIR")
    llm, sampling_params = _make_llm(args)

    rng = random.Random(args.seed)

    def new_prompts(n: int) -> list[dict]:
        return [{"prompt_token_ids": [rng.randrange(1000, 30000) for _ in range(args.prompt_len)]} for _ in range(n)]

    unit, per = ("decode step", args.steps) if args.phase == "decode" else (
        "1,000 prompt tokens", args.num_seqs * args.prompt_len / 1000)

    def step_cost(profile: bool) -> tuple[float, dict[str, tuple[float, float]]]:
        """(seconds per unit, {operator: (self seconds, calls) per unit}): a decode step, or 1,000
        prompt tokens of prefill."""
        runs = []
        for max_tokens in (1, 1 + args.steps) if args.phase == "decode" else (1,):
            runs.append(_run(llm, new_prompts(args.num_seqs), sampling_params(max_tokens), profile))
        wall, ops = runs[-1]
        base_wall, base_ops = runs[0] if args.phase == "decode" else (0.0, {})  # decode: minus the prefill
        return (wall - base_wall) / per, {
            name: ((t - base_ops.get(name, (0.0, 0))[0]) / per, (c - base_ops.get(name, (0.0, 0))[1]) / per)
            for name, (t, c) in ops.items()
        }

    llm.generate(new_prompts(2), sampling_params(4), use_tqdm=False)  # warm-up
    wall, _ = step_cost(profile=False)
    profiled_wall, ops = step_cost(profile=True)
    print(f"{args.engine}: {args.num_seqs} sequences of {args.prompt_len} prompt tokens, {args.dtype}, "
          + (f"{args.steps} decode steps" if args.phase == "decode" else "prefill"))
    print(f"{unit}: {wall * 1e3:.1f} ms (unprofiled), {profiled_wall * 1e3:.1f} ms profiled, of which "
          f"{sum(t for t, _ in ops.values()) * 1e3:.1f} ms in operators")
    print(f"| operator | ms per {unit} | calls per {unit} |")
    print("|---|---|---|")
    for name, (t, calls) in sorted(ops.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"| `{name}` | {t * 1e3:.2f} | {calls:.0f} |")
    return 0


def _make_llm(args):
    if args.engine == "vllm":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        from vllm import LLM, SamplingParams

        # tracevllm's CPU KV budget (gpu_worker._CPU_KV_CACHE_BYTES; not importable from vLLM's venv).
        llm = LLM(model=args.model, dtype=args.dtype, seed=args.seed, kv_cache_memory_bytes=1 << 30)
    else:
        from tracevllm import LLM, SamplingParams

        llm = LLM(model=args.model, dtype=args.dtype, seed=args.seed)
    return llm, lambda max_tokens: SamplingParams(temperature=1.0, ignore_eos=True, max_tokens=max_tokens)


def _run(llm, prompts, params, profile: bool) -> tuple[float, dict[str, tuple[float, int]]]:
    """Wall seconds of one ``generate``, and with ``profile`` each operator's (self CPU seconds, calls)."""
    import torch.profiler

    if not profile:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start, {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
    return wall, {e.key: (e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()}


if __name__ == "__main__":
    sys.exit(main())
