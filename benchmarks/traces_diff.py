"""How long ``tracevllm traces diff A B`` takes on two traces of 10,000 engine steps or more.

    python benchmarks/traces_diff.py [--num-requests 2500] [--repeats 3] [--keep DIR] [--trace-dirs A B]

Records two runs of the same ``--num-requests`` requests (distinct 8-token prompts, 4 output tokens,
``ignore_eos``) with the tests' tiny random-weight Llama (``tests/tiny_checkpoints.py``: a step costs
little beyond the engine's own work and its tracing), one request at a time (``max_num_seqs=1``),
at step level: each request's prompt in one step, then 3 decodes, 4 steps a request. A keeps its KV
in blocks of 16 tokens, B in blocks of 8: the schedules are the same, the block ids are not, so
every one of the 10,000 steps is compared. (A token budget of 4 would part them at step 1, but the
waiting requests' reason would then change at almost every step, between the spent budget and
``max_num_seqs``, and each change is a ``WAITING`` event on each waiting request: that trace was
nearly twice as large at the same number of steps.)

Then it times the command as a user runs it, ``tracevllm traces diff A B --json`` in a fresh Python
process (its start and imports included), ``--repeats`` times, and prints the median; then, in this
process, the parts: loading each trace (``viz.load_trace``, its requests and steps as the command
reads them), comparing (``viz.compare_runs``), the
text and JSON, and drawing the picture (``-o``, not part of the timed command). ``--keep DIR`` keeps
the two recordings (``DIR/a``, ``DIR/b``), ``--trace-dirs A B`` times two existing ones instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)  # for tests/tiny_checkpoints.py

PROMPT_LEN, OUTPUT_LEN = 8, 4
BLOCK_SIZES = {"a": 16, "b": 8}


def record(checkpoint: str, trace_dir: str, num_requests: int, block_size: int) -> None:
    from tracevllm import LLM, SamplingParams

    prompts = [{"prompt_token_ids": [100 + (PROMPT_LEN * i + k) % 40000 for k in range(PROMPT_LEN)]}
               for i in range(num_requests)]
    llm = LLM(checkpoint, trace_out=trace_dir, dtype="float32", block_size=block_size, max_model_len=64,
              max_num_seqs=1, max_num_batched_tokens=64)
    start = time.perf_counter()
    try:
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=OUTPUT_LEN, ignore_eos=True), use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    print(f"recorded {num_requests} requests in blocks of {block_size} in {time.perf_counter() - start:.1f} s "
          f"to {trace_dir}", flush=True)


def time_command(a: str, b: str, repeats: int) -> list[float]:
    """Wall seconds of ``tracevllm traces diff A B --json`` in a fresh process, each time."""
    command = [sys.executable, "-m", "tracevllm.entrypoints.cli", "traces", "diff", a, b, "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
        seconds.append(time.perf_counter() - start)
    return seconds


def time_parts(a: str, b: str, picture: str) -> None:
    from viz.diff import compare_runs, describe
    from viz.trace_loader import REQUEST_AND_STEP_SPANS, load_trace
    from viz.plots.aligned_timelines import plot_aligned_timelines

    timings = {}
    start = time.perf_counter()
    trace_a = load_trace(a, REQUEST_AND_STEP_SPANS)  # what the command reads
    timings["load A"] = time.perf_counter() - start
    t = time.perf_counter()
    trace_b = load_trace(b, REQUEST_AND_STEP_SPANS)
    timings["load B"] = time.perf_counter() - t
    t = time.perf_counter()
    comparison = compare_runs(trace_a, trace_b)
    timings["compare"] = time.perf_counter() - t
    t = time.perf_counter()
    describe(comparison)
    json.dumps(comparison.as_dict())
    timings["text and JSON"] = time.perf_counter() - t
    t = time.perf_counter()
    plot_aligned_timelines(comparison).savefig(picture)
    timings["picture (-o, PNG)"] = time.perf_counter() - t
    print(f"A: {len(trace_a.steps)} steps, {len(trace_a.requests)} requests, {len(trace_a.spans)} spans; "
          f"B: {len(trace_b.steps)} steps, {len(trace_b.spans)} spans")
    d = comparison.divergence
    print(f"the schedules part at step {d.step}: {d.differences[0].why}" if d else "the schedules never part")
    for name, seconds in timings.items():
        print(f"  {name:<20} {seconds:6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=2500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="record into DIR/a and DIR/b and keep them")
    parser.add_argument("--trace-dirs", nargs=2, metavar=("A", "B"), help="time these recordings instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.trace_dirs:
            a, b = args.trace_dirs
        else:
            from tests.tiny_checkpoints import make_tiny_checkpoint
            from tracevllm.models.loader import resolve_model

            checkpoint = make_tiny_checkpoint("llama", os.path.join(scratch, "llama"), resolve_model(None))
            root = args.keep or scratch
            a, b = os.path.join(root, "a"), os.path.join(root, "b")
            for trace_dir, name in ((a, "a"), (b, "b")):
                if not os.path.isdir(trace_dir):  # --keep: recorded before
                    record(checkpoint, trace_dir, args.num_requests, BLOCK_SIZES[name])
        seconds = time_command(a, b, args.repeats)
        print(f"tracevllm traces diff A B --json: median {statistics.median(seconds):.2f} s over {len(seconds)} runs "
              f"({', '.join(f'{s:.2f}' for s in seconds)})")
        time_parts(a, b, os.path.join(scratch, "aligned.png"))


if __name__ == "__main__":
    main()
