"""``tracevllm bench viz``: how long ``viz`` takes to replay a large trace directory.

Records ``--num-prompts`` random requests with tracing at step level (bundled model unless
``--model``; short prompts and outputs, so recording is quick), unless ``--trace-dir`` points at an
existing recording; then times, one after the other, loading the directory, drawing each picture
(and saving it as PNG) and writing the whole report.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import tempfile
import time


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--trace-dir", default=None, help="replay this recording instead of making one")


def _record(engine_args, num_prompts: int, trace_dir: str, seed: int) -> None:
    from tracevllm import LLM, SamplingParams

    rng = random.Random(seed)
    llm = LLM.from_engine_args(dataclasses.replace(engine_args, trace_out=trace_dir, trace_level="step"))
    vocab_size = llm.llm_engine.model_config.vocab_size
    prompts = [[rng.randrange(vocab_size) for _ in range(rng.randint(16, 64))] for _ in range(num_prompts)]
    params = [SamplingParams(max_tokens=rng.randint(8, 32), ignore_eos=True) for _ in prompts]
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=True)
    print(f"recorded {num_prompts} requests in {time.perf_counter() - start:.1f} s to {trace_dir}")


def run_viz_benchmark(args: argparse.Namespace) -> int:
    from tracevllm.engine.arg_utils import EngineArgs

    with tempfile.TemporaryDirectory() as scratch:
        trace_dir = args.trace_dir
        if trace_dir is None:
            trace_dir = os.path.join(scratch, "traces")
            _record(EngineArgs.from_cli_args(args), args.num_prompts, trace_dir, args.seed)
        _time_replay(trace_dir, os.path.join(scratch, "report"))
    return 0


def _time_replay(trace_dir: str, out_dir: str) -> None:
    import viz

    timings = {}
    start = time.perf_counter()
    trace = viz.load_trace(trace_dir)
    timings["load_trace"] = time.perf_counter() - start
    os.makedirs(out_dir)
    for name in ("plot_request_timeline", "plot_kv_block_map", "plot_step_composition", "plot_engine_gauges"):
        t = time.perf_counter()
        getattr(viz, name)(trace).savefig(os.path.join(out_dir, f"{name}.png"))
        timings[name] = time.perf_counter() - t
    load_and_pictures = time.perf_counter() - start
    t = time.perf_counter()
    viz.write_report(trace, out_dir)
    timings["write_report (all pictures, PNG + SVG, HTML)"] = time.perf_counter() - t
    print(f"{len(trace.requests)} requests, {len(trace.steps)} engine steps, {len(trace.spans)} spans")
    for name, seconds in timings.items():
        print(f"  {name:<48} {seconds:7.2f} s")
    print(f"  {'load + four pictures':<48} {load_and_pictures:7.2f} s")
