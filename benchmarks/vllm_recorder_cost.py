"""What recording costs a vLLM server: ``vllm serve`` with tracevllm's recorder against plain vLLM,
alternated, under ``vllm bench serve``.

    python benchmarks/vllm_recorder_cost.py --vllm-python .venv-vllm/bin/python [--rounds 3] [--concurrency 8 32]

Four servers of the bundled model, started one after the other and left up (each idle while another
is measured), all with vLLM's default options: ``plain``; ``recorded`` (``--scheduler-cls``, by default
``tracevllm.vllm.TracingScheduler``; where vLLM schedules asynchronously, on GPUs, pass
``--scheduler-cls tracevllm.vllm.TracingAsyncScheduler``); ``in-process`` (the same recorder with
optimisation ``observer_process`` off: its tracer in vLLM's engine core); and ``plain again``. vLLM-CPU
schedules synchronously whatever it is asked, so on a CPU all run vLLM's synchronous ``Scheduler``.

Plain vLLM is started first and last because where a server starts in the line moves its speed: on the
2-core Xeon of docs/vllm.md, the server started first was the slowest of its run in 3 of 5 runs and
the second slowest in the other 2 (2026-12-07), whatever it ran. Each recorder is held to both plain
servers' runs pooled.

Each round runs every server at each concurrency C (``4 C`` random prompts of 128 tokens to 64,
``--ignore-eos``, a new seed every run so that no run is served from another's prefix cache), in an
order that turns each round. It prints every run, the medians, and each recorder / plain; then stops
the servers (SIGTERM, with ``--shutdown-timeout``) and holds each recorded trace to ``traces check``,
with one request in it for every request sent.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_neighbour import SERVED_NAME, _bench  # noqa: E402
from soak_serve import wait_healthy  # noqa: E402

from tracevllm.benchmarks.compare import machine_line  # noqa: E402
from tracevllm.models.loader import resolve_model  # noqa: E402
from tracevllm.optimizations import DISABLE_ENV  # noqa: E402
from viz.check import check_trace  # noqa: E402

TRACE_DIR_ENV = "TRACEVLLM_TRACE_DIR"  # tracevllm/vllm/recording.py's (importing it needs vLLM)



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=os.environ.get("TRACEVLLM_VLLM_PYTHON", ".venv-vllm/bin/python"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=8040, help="the first server's; the next ones count up")
    parser.add_argument("--scheduler-cls", default="tracevllm.vllm.TracingScheduler",
                        help="the recorder (tracevllm.vllm.TracingAsyncScheduler where vLLM schedules asynchronously)")
    args = parser.parse_args()
    recorder = ["--scheduler-cls", args.scheduler_cls]
    servers = {"plain": [], "recorded": recorder, "in-process": recorder, "plain again": []}
    model_dir = str(resolve_model(None))
    env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_LOGGING_LEVEL": "ERROR"}
    envs = {"recorded": {TRACE_DIR_ENV: tempfile.mkdtemp(prefix="vllm_recorder_cost_trace_")},
            "in-process": {TRACE_DIR_ENV: tempfile.mkdtemp(prefix="vllm_recorder_cost_trace_in_process_"),
                           DISABLE_ENV: "observer_process"},
            "plain": {}, "plain again": {}}
    print(machine_line())
    for name in ("recorded", "in-process"):
        print(f"the {name} server's trace: {envs[name][TRACE_DIR_ENV]}")
    ports = {name: args.port + i for i, name in enumerate(servers)}
    procs: dict[str, subprocess.Popen] = {}
    runs: dict[str, list[list[float]]] = {name: [[] for _ in args.concurrency] for name in servers}
    num_sent = {name: 0 for name in servers}
    try:
        for name, flags in servers.items():  # one start-up at a time
            log = tempfile.NamedTemporaryFile("w", prefix=f"vllm_recorder_cost_{name.replace(' ', '_')}_",
                                              suffix=".log", delete=False)
            print(f"{name}'s log: {log.name}", flush=True)
            procs[name] = subprocess.Popen(
                [args.vllm_python, "-m", "tracevllm.vllm", "serve", model_dir, "--dtype", args.dtype,
                 "--port", str(ports[name]), "--served-model-name", SERVED_NAME, "--shutdown-timeout", "60", *flags],
                env={**env, **envs[name]}, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
            wait_healthy(ports[name], procs[name])
            _bench(args.vllm_python, model_dir, ports[name], 1)  # warm-up
            num_sent[name] += 4
        names = list(servers)
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                rates = []
                for i, c in enumerate(args.concurrency):
                    rate, failed = _bench(args.vllm_python, model_dir, ports[name], c)
                    assert failed == 0, f"{name}: {failed} failed requests"
                    runs[name][i].append(rate)
                    rates.append(rate)
                    num_sent[name] += 4 * c
                print(f"round {round_ + 1} {name:<11} " + " / ".join(f"{r:.1f}" for r in rates)
                      + f" output tok/s at c = {' / '.join(map(str, args.concurrency))}", flush=True)
    finally:
        for proc in procs.values():
            proc.send_signal(15)
        for proc in procs.values():
            proc.wait(timeout=120)
    medians = {name: [statistics.median(r) for r in per_c] for name, per_c in runs.items()}
    print(f"\nmedians of {args.rounds} rounds, output tok/s at c = {' / '.join(map(str, args.concurrency))}:")
    for name, values in medians.items():
        print(f"{name:<11} " + " / ".join(f"{v:.1f}" for v in values))
    plain = [statistics.median(a + b) for a, b in zip(runs["plain"], runs["plain again"])]
    print("both plain servers' runs pooled: " + " / ".join(f"{v:.1f}" for v in plain))
    whole = True
    for name in ("recorded", "in-process"):
        print(f"{name} / plain: " + " / ".join(f"{r / o:.3f}" for r, o in zip(medians[name], plain)))
        trace, violation = check_trace(envs[name][TRACE_DIR_ENV])
        print(f"  its trace: {len(trace.requests) if trace else 0} requests of {num_sent[name]} sent, "
              f"{len(trace.steps) if trace else 0} steps; traces check: {violation or 'every invariant holds'}")
        whole &= violation is None and trace is not None and len(trace.requests) == num_sent[name]
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
