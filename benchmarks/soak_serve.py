"""Soak: ``tracevllm serve`` under ``tracevllm bench serve --duration`` at a fixed concurrency, with the
server's memory sampled throughout.

    python benchmarks/soak_serve.py --duration 300 --max-concurrency 32

It starts a server on the bundled model, runs the soak against it, and prints the bench report, then
the resident memory of the API server and of the engine core (and any workers) every
``--sample-every`` seconds. "Flat after warm-up" is judged on those samples: the growth from the
first sample after ``--warmup`` seconds to the last. Extra arguments after ``--`` go to ``serve``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited during start-up (code {proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become healthy in time")


def sample_memory(pid: int, every: float, stop: threading.Event, samples: list[tuple[float, dict[str, float]]]):
    """Every ``every`` seconds: MB resident per process of the server's tree, by process title."""
    root = psutil.Process(pid)
    start = time.time()
    while not stop.wait(every):
        try:
            procs = [root, *root.children(recursive=True)]
            rss = {}
            for p in procs:
                name = p.name()
                rss[name] = rss.get(name, 0.0) + p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            return
        samples.append((time.time() - start, rss))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=256, help="distinct prompts, cycled")
    parser.add_argument("--random-input-len", type=int, default=128)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--random-range-ratio", type=float, default=0.5)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("serve_args", nargs="*", help="after --: extra flags for tracevllm serve")
    args = parser.parse_args()

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--port", str(port),
                               "--uvicorn-log-level", "warning", *args.serve_args])
    try:
        wait_healthy(port, server)
        samples: list[tuple[float, dict[str, float]]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_memory, args=(server.pid, args.sample_every, stop, samples))
        sampler.start()
        bench = subprocess.run([
            sys.executable, "-m", "tracevllm.entrypoints.cli", "bench", "serve", "--base-url",
            f"http://127.0.0.1:{port}", "--duration", str(args.duration), "--max-concurrency",
            str(args.max_concurrency), "--num-prompts", str(args.num_prompts), "--random-input-len",
            str(args.random_input_len), "--random-output-len", str(args.random_output_len),
            "--random-range-ratio", str(args.random_range_ratio), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--disable-tqdm",
        ])
        stop.set()
        sampler.join()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    print(f"{' Memory (MB resident) ':=^50}")
    names = sorted({name for _, rss in samples for name in rss})
    print(f"{'t (s)':>7} " + " ".join(f"{n:>14}" for n in names))
    for t, rss in samples:
        print(f"{t:7.0f} " + " ".join(f"{rss.get(n, 0.0):14.1f}" for n in names))
    after = [rss for t, rss in samples if t >= args.warmup]
    if len(after) >= 2:
        for n in names:
            print(f"{n}: {after[-1].get(n, 0.0) - after[0].get(n, 0.0):+.1f} MB from t={args.warmup:.0f} s to the end")
    print(f"server exit code {server.returncode}; CPU: {os.cpu_count()} cores")
    return bench.returncode


if __name__ == "__main__":
    sys.exit(main())
