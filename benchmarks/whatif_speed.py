"""How long ``tracevllm traces whatif`` takes, against the run it replays, and on 10,000 requests.

    python benchmarks/whatif_speed.py TRACE_DIR [--repeats 3] [--num-requests 10000]

TRACE_DIR: a recorded run (``benchmarks/whatif_fidelity.py --mode offline`` leaves one, 200 requests,
in ``offline-baseline``). It times, each as a fresh process (interpreter start, imports, loading the
trace, fitting, replaying, writing the predicted trace): importing what the command needs; the
command on the recorded workload, against the recorded run's duration (first arrival to last finish);
and the command with ``--num-requests``. Each figure is the median of ``--repeats`` runs, back to back
(one for the long one), as wall-clock seconds and as the CPU seconds (user + system) the process used,
which a machine shared with other work does not inflate as much.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from viz.trace_loader import load_trace

CLI = [sys.executable, "-m", "tracevllm.entrypoints.cli", "traces", "whatif"]


def _timed(command: list[str], repeats: int, output: str | None = None) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``command``."""
    walls, cpus = [], []
    for _ in range(repeats):
        if output is not None:
            shutil.rmtree(output, ignore_errors=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


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
    print(f"import tracevllm.whatif.command: {imports[0]:.2f} s wall, {imports[1]:.2f} s CPU (median of {args.repeats})")
    print(f"traces whatif, the recorded workload: {same[0]:.2f} s wall (1/{duration / same[0]:.0f} of the run), "
          f"{same[1]:.2f} s CPU (1/{duration / same[1]:.0f}) (median of {args.repeats})")
    print(f"traces whatif --num-requests {args.num_requests}: {many[0]:.1f} s wall, {many[1]:.1f} s CPU (one run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
