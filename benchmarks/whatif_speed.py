"""How long ``tracevllm traces whatif`` takes, against the run it replays, and on 10,000 requests.

    python benchmarks/whatif_speed.py TRACE_DIR [--repeats 3]

TRACE_DIR: a recorded run (``benchmarks/whatif_fidelity.py --mode offline`` leaves one, 200 requests,
in ``offline-baseline``). It times, each as a fresh process (interpreter start, imports, loading the
trace, fitting, replaying, writing the predicted trace): importing what the command needs; the
command on the recorded workload, against the recorded run's duration (first arrival to last finish);
and the command with ``--num-requests 10000``. Medians of ``--repeats`` runs, back to back.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from viz.loader import load_trace

CLI = [sys.executable, "-m", "tracevllm.entrypoints.cli", "traces", "whatif"]


def _timed(command: list[str], repeats: int, output: str | None = None) -> float:
    times = []
    for _ in range(repeats):
        if output is not None:
            shutil.rmtree(output, ignore_errors=True)
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=10_000)
    args = parser.parse_args(argv)
    trace = load_trace(args.trace_dir)
    requests = list(trace.requests.values())
    duration = max(r.finished for r in requests) - min(r.arrival for r in requests)
    out = tempfile.mkdtemp(prefix="whatif-speed-")
    imports = _timed([sys.executable, "-c", "import tracevllm.whatif.command"], args.repeats)
    same = _timed([*CLI, args.trace_dir, "-o", f"{out}/same"], args.repeats, f"{out}/same")
    many = _timed([*CLI, args.trace_dir, "--num-requests", str(args.num_requests), "-o", f"{out}/many"], 1,
                  f"{out}/many")
    print(f"recorded run: {len(requests)} requests, {len(trace.steps)} steps, {duration:.1f} s")
    print(f"import tracevllm.whatif.command: {imports:.2f} s (median of {args.repeats})")
    print(f"traces whatif, the recorded workload: {same:.2f} s (median of {args.repeats}), "
          f"1/{duration / same:.0f} of the run")
    print(f"traces whatif --num-requests {args.num_requests}: {many:.1f} s (one run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
