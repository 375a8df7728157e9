"""The host path of one decode step, part by part: what the engine's Python costs around the model.

    python benchmarks/host_path.py [--workload latency decode] [--device cpu|cuda]
        [--attention-backend NAME] [--disable-optimizations A B ...] [--output-len N]
        [--temperature T] [--profile PATH] [--json PATH]

Each workload (``tracevllm bench throughput``'s presets: ``latency``, 1 request; ``decode``, 48) runs
on the bundled model with an observer on the engine core, so that every ``StepRecord`` carries the
stages and the model runner's host parts (``core/stages.py``: ``StepPart``). Of the steps where the
whole workload decodes together, the table gives the median of each, in milliseconds:

- the stages ``schedule`` and ``update_from_output`` (the scheduler), and each host part of
  ``execute_model`` and ``sample``; ``executor`` is what those two stages took beyond their parts
  (in one process, a few calls; with the mp executor, the messages to the worker and back);
- ``host total``: all of these together (``device_sync`` excepted: it is waiting, not work);
- ``device_sync`` (on CPU the forward ran in ``forward``: this is only a copy; on CUDA, the wait for
  the device), the whole ``step``, and on CUDA the ``forward (device)`` time of forward and logits.

Each median is taken on its own, so the rows need not add up to the totals.

Below them, the whole ``generate`` call, per output token: its wall time (what ``tracevllm bench
throughput`` divides), the engine-core steps' share of it (all steps, the prefill included), and what
ran outside any step (the front end: output processing, detokenising, the ``LLM`` loop). A latency
figure far above its decode step is explained here. ``--temperature`` (0: greedy) is the requests';
the bench samples at 1.0. ``--profile`` writes a cProfile of the workloads' ``generate`` calls.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import random
import statistics
import sys
import time

from tracevllm import LLM, SamplingParams
from tracevllm.benchmarks.compare import machine_line
from tracevllm.benchmarks.throughput import WORKLOADS
from tracevllm.core.events import StepRecord
from tracevllm.core.stages import STEP_PARTS, StepPart, Stage

EXECUTOR, HOST_TOTAL, STEP, FORWARD_DEVICE = "executor", "host total", "step", "forward (device)"
GENERATE, IN_STEPS, OUTSIDE, FIRST_STEP = ("generate, ms a token", "in engine steps, ms a token",
                                         "outside the steps, ms a token", "first step (prefill), ms")
WHOLE_CALL_ROWS = (GENERATE, IN_STEPS, OUTSIDE, FIRST_STEP)
ROWS = (Stage.SCHEDULE, *STEP_PARTS[Stage.EXECUTE_MODEL], *(p for p in STEP_PARTS[Stage.SAMPLE] if p != StepPart.DEVICE_SYNC),
        Stage.UPDATE_FROM_OUTPUT, EXECUTOR, HOST_TOTAL, StepPart.DEVICE_SYNC, STEP, FORWARD_DEVICE)


class StepRecords(list):
    """An engine-core observer that keeps the ``StepRecord``\\ s."""

    def on_event(self, event) -> None:
        if isinstance(event, StepRecord):
            self.append(event)


def decode_step_rows(record: StepRecord) -> dict[str, float]:
    """One step's rows of the table, in seconds."""
    d, parts = record.durations, record.parts
    rows = {Stage.SCHEDULE: d[Stage.SCHEDULE], Stage.UPDATE_FROM_OUTPUT: d[Stage.UPDATE_FROM_OUTPUT], **parts}
    rows[EXECUTOR] = sum(d[stage] - sum(parts[p] for p in STEP_PARTS[stage]) for stage in STEP_PARTS)
    rows[HOST_TOTAL] = sum(d.values()) - parts[StepPart.DEVICE_SYNC]
    rows[STEP] = sum(d.values())
    if record.forward_device_s is not None:
        rows[FORWARD_DEVICE] = record.forward_device_s
    return rows


def run_workload(llm: LLM, records: StepRecords, name: str, output_len: int | None, seed: int,
                 temperature: float, profile: cProfile.Profile | None) -> dict[str, float]:
    """The medians (ms) of the workload's full decode steps (every request decoding), and the
    whole ``generate`` call per output token."""
    workload = WORKLOADS[name]
    rng = random.Random(seed)
    prompts = [{"prompt_token_ids": [rng.randrange(1000, 30000) for _ in range(workload.input_len[0])]}
               for _ in range(workload.num_prompts)]
    max_tokens = output_len or workload.output_len[0]
    params = SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=max_tokens)
    records.clear()
    start = time.perf_counter()
    if profile is not None:
        profile.enable()
    llm.generate(prompts, params, use_tqdm=False)
    if profile is not None:
        profile.disable()
    wall = time.perf_counter() - start
    steps = [decode_step_rows(r) for r in records if r.parts and r.batch is not None
             and len(r.batch.scheduled) == workload.num_prompts and all(s.is_decode for s in r.batch.scheduled)]
    medians = {row: statistics.median(s[row] for s in steps) * 1e3 for row in ROWS if steps and row in steps[0]}
    tokens = workload.num_prompts * max_tokens
    in_steps = sum(sum(r.durations.values()) for r in records)
    whole = {GENERATE: wall, IN_STEPS: in_steps, OUTSIDE: wall - in_steps}
    return {"num_requests": workload.num_prompts, "num_decode_steps": len(steps), **medians,
            **{row: 1e3 * seconds / tokens for row, seconds in whole.items()},
            FIRST_STEP: 1e3 * sum(records[0].durations.values())}


def print_table(results: dict[str, dict[str, float]]) -> None:
    names = list(results)
    header = ["ms per decode step"] + [f"{n} ({results[n]['num_requests']})" for n in names]
    lines = [[row] + [f"{results[n][row]:.3f}" for n in names] for row in ROWS if all(row in results[n] for n in names)]
    lines.append(["decode steps"] + [str(results[n]["num_decode_steps"]) for n in names])
    lines += [[row] + [f"{results[n][row]:.3f}" for n in names] for row in WHOLE_CALL_ROWS]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    for line in [header, *lines]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=["latency", "decode"], default=["latency", "decode"])
    parser.add_argument("--model", default=None, help="a Hugging Face directory (default: the bundled model)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--disable-optimizations", nargs="*", default=None,
                        help="names passed on to LLM(disable_optimizations=...)")
    parser.add_argument("--output-len", type=int, default=None, help="tokens per request (default: the workload's)")
    parser.add_argument("--temperature", type=float, default=0.0, help="the requests' (0: greedy; the bench's: 1.0)")
    parser.add_argument("--profile", default=None, metavar="PATH", help="write a cProfile of the generate calls here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the medians here")
    args = parser.parse_args(argv)
    options = {"device": args.device, "seed": args.seed, "attention_backend": args.attention_backend,
               "disable_optimizations": args.disable_optimizations, "dtype": args.dtype}
    llm = LLM(args.model, **{k: v for k, v in options.items() if v is not None})
    records = StepRecords()
    llm.llm_engine.engine_core.engine_core.recorder.add_observer(records)
    llm.generate([{"prompt_token_ids": list(range(1000, 1032))}] * 2, SamplingParams(max_tokens=4), use_tqdm=False)

    profile = cProfile.Profile() if args.profile else None
    results = {name: run_workload(llm, records, name, args.output_len, args.seed, args.temperature, profile)
               for name in args.workload}
    if profile is not None:
        profile.dump_stats(args.profile)
    print(machine_line())
    if llm.llm_engine.vllm_config.device.type == "cuda":
        import torch

        print(f"GPU: {torch.cuda.get_device_name()}")
    print(f"device {args.device}, attention backend {args.attention_backend or 'default'}, disabled optimisations: "
          f"{' '.join(args.disable_optimizations or []) or 'none'}")
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_line(), "options": vars(args), "workloads": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
