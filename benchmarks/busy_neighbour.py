"""A neighbour that takes a core after start-up: generation quiet, then beside a busy core, then quiet
again, in one engine, with the thread count it ran each phase on.

    python benchmarks/busy_neighbour.py                      # the default: threads follow the load
    python benchmarks/busy_neighbour.py --disable-optimizations cpu_thread_follower  # start-up's count
    python benchmarks/busy_neighbour.py --cpu-threads 1

The neighbour is ``python3 -c "while True: pass"`` pinned to core 0, started once the engine is up
and the quiet phase is done (so the start-up probe never sees it), and stopped before the last
phase. Each phase runs ``--runs`` generates of ``--num-prompts`` x ``--input-len`` -> ``--output-len``
tokens (the issue's 4 x 32 -> 32 by default) and prints each one's output tok/s: the first run of a
phase includes the time the engine takes to notice the change.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import torch

from tracevllm import LLM, SamplingParams


def _generate(llm: LLM, prompts: list[list[int]], output_len: int) -> float:
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds


@contextlib.contextmanager
def busy_core(core: int = 0) -> Iterator[subprocess.Popen]:
    """Another process spinning on ``core`` while the block runs (the block gets the process)."""
    neighbour = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\n"
                                  "while True: pass"])
    time.sleep(0.5)
    try:
        yield neighbour
    finally:
        neighbour.kill()
        neighbour.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--cpu-threads", type=int)
    parser.add_argument("--disable-optimizations", nargs="*")
    args = parser.parse_args()
    llm = LLM(args.model, dtype=args.dtype, cpu_threads=args.cpu_threads,
              disable_optimizations=args.disable_optimizations)
    prompts = [[100 + (7 * i + j) % 1000 for j in range(args.input_len)] for i in range(args.num_prompts)]
    _generate(llm, prompts[:1], 16)  # warm-up
    print(f"cpu: {os.cpu_count()} cores; phase: output tok/s of each run (torch threads after it)")
    for phase in ("quiet", "busy", "quiet again"):
        runs = []
        with busy_core() if phase == "busy" else contextlib.nullcontext():
            for _ in range(args.runs):
                rate = _generate(llm, prompts, args.output_len)
                runs.append(f"{rate:.1f} ({torch.get_num_threads()})")
        print(f"{phase:<12} {', '.join(runs)}", flush=True)


if __name__ == "__main__":
    main()
