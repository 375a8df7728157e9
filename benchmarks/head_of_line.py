"""A short request behind one long prompt, served: how long the short one waits, under each setting.

    python benchmarks/head_of_line.py --dtype float32
    python benchmarks/head_of_line.py --long-len 8100 --repeats 3 --settings "" \\
        "--long-prefill-token-threshold 64" "--max-num-batched-tokens 512"

For each setting (flags for ``tracevllm serve``, the empty string for its defaults) it starts a
traced server on the bundled model, warms it up, then ``--repeats`` times sends one prompt of
``--long-len`` random tokens (``max_tokens=1``), waits ``--delay`` seconds and sends one of 16 tokens
(``max_tokens=1``). It prints, per setting: the step budget the server chose, the short request's
latency and the long one's (medians over the repeats), and, from the trace, the median step of the
long prompt's chunks at under 1,024 tokens of context and at the last eighth of its context: what
one chunk costs as its attention reads more context. The settings run one after the other, a fresh
server each; run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from soak_serve import wait_healthy  # benchmarks/ is on sys.path when this runs as a script
from viz.trace_loader import load_trace

SERVED_NAME = "SmolLM2-135M-Instruct"


def _complete(port: int, prompt: list[int]) -> float:
    """Seconds until a one-token completion of ``prompt`` comes back."""
    body = json.dumps({"model": SERVED_NAME, "prompt": prompt, "max_tokens": 1, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=1800) as response:
        json.load(response)
    return time.perf_counter() - started


class Server:
    """``tracevllm serve`` with ``flags``, traced into a directory of its own."""

    def __init__(self, flags: str, dtype: str, port: int, max_model_len: int) -> None:
        self.flags, self.port = flags, port
        self.trace_dir = tempfile.mkdtemp(prefix="head_of_line_")
        self.log = open(os.path.join(self.trace_dir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--dtype", dtype, "--port", str(port),
             "--max-model-len", str(max_model_len), "--trace-out", os.path.join(self.trace_dir, "traces"),
             "--disable-log-stats", *shlex.split(flags)],
            stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
        wait_healthy(port, self.proc)

    def budget(self) -> str:
        with open(self.log.name) as f:
            lines = [line.strip() for line in f if "max_num_batched_tokens" in line]
        return lines[0] if lines else "(not logged)"

    def stop(self) -> None:
        os.killpg(self.proc.pid, 15)
        self.proc.wait()
        self.log.close()


def _chunk_steps(trace_dir: str, long_len: int) -> tuple[list[float], list[float]]:
    """Durations (ms) of the steps that ran a chunk of a ``long_len``-token prompt (and nothing else):
    those with under 1,024 tokens of its context, and those in its last eighth."""
    trace = load_trace(trace_dir)
    long_ids = {r.request_id for r in trace.requests.values() if r.num_prompt_tokens == long_len}
    early, late = [], []
    for step in trace.steps:
        if len(step.req_ids) != 1 or step.req_ids[0] not in long_ids or step.one_time_costs:
            continue
        computed = step.req_num_computed_tokens[0]
        if computed < 1024:
            early.append((step.end - step.start) * 1e3)
        elif computed >= long_len * 7 // 8:
            late.append((step.end - step.start) * 1e3)
    return early, late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--port", type=int, default=8031)
    parser.add_argument("--long-len", type=int, default=8100)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds between the long and the short request")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", nargs="+", default=["", "--long-prefill-token-threshold 64"])
    args = parser.parse_args()
    rng = random.Random(0)
    results = {flags: {"short": [], "long": []} for flags in args.settings}
    budgets, steps = {}, {}
    for flags in args.settings:
        server = Server(flags, args.dtype, args.port, args.long_len + 64)
        try:
            budgets[flags] = server.budget()
            _complete(args.port, [rng.randrange(200, 40000) for _ in range(16)])  # warm-up: first-use costs
            _complete(args.port, [rng.randrange(200, 40000) for _ in range(600)])
            for _ in range(args.repeats):
                long_prompt = [rng.randrange(200, 40000) for _ in range(args.long_len)]
                short_prompt = [rng.randrange(200, 40000) for _ in range(16)]
                long_latency: list[float] = []
                thread = threading.Thread(target=lambda: long_latency.append(_complete(args.port, long_prompt)))
                thread.start()
                time.sleep(args.delay)
                results[flags]["short"].append(_complete(args.port, short_prompt))
                thread.join()
                results[flags]["long"].append(long_latency[0])
        finally:
            server.stop()
        steps[flags] = _chunk_steps(os.path.join(server.trace_dir, "traces"), args.long_len)
        early, late = steps[flags]
        print(f"setting {flags or '(defaults)'!r}: {budgets[flags]}", flush=True)
        print(f"  short request: {statistics.median(results[flags]['short']):.2f} s "
              f"(each: {', '.join(f'{s:.2f}' for s in results[flags]['short'])}); "
              f"long: {statistics.median(results[flags]['long']):.2f} s; chunk step at <1k context: "
              f"{statistics.median(early) if early else float('nan'):.0f} ms ({len(early)}), "
              f"at the last eighth: {statistics.median(late) if late else float('nan'):.0f} ms ({len(late)}); "
              f"trace: {server.trace_dir}", flush=True)


if __name__ == "__main__":
    main()
