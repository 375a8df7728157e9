"""Who used the cores while a benchmark ran: the CPU time of each of a few processes (with their
children) and of their busiest threads, over the same stretch of wall time, in cores.

    python benchmarks/cpu_shares.py --seconds 10 server=PID neighbour=PID   # watch running processes

or from a script:

    before = CpuShares.take({"server": server_pid, "neighbour": neighbour_pid})
    ...                                   # the run
    print(before.since())
    # cores used: server 1.01 (core 1: 0.72, core 0: 0.29); neighbour 0.71 (core 0: 0.71); ended children 0.13

A server beside a busy core is only as fast as the share of that core its threads get; a rate alone
does not say whether a slow run lost the core to the neighbour, left it idle, or gave it to the client
(docs/perf-log.md, "serving on a Zen 4 again, and what keeps vLLM fast beside a busy core"). Threads are named by the core they last ran on, which is
where they stay only when they are bound to one. Processes and threads that start or end inside the
stretch count from their start, or not at all: a client that starts and exits inside it is counted
by its parent instead (``resource.getrusage(RUSAGE_CHILDREN)``).
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import dataclass

import psutil

TOP_THREADS = 2


def _thread_seconds(pid: int) -> dict[int, tuple[float, int]]:
    """CPU seconds of every thread of ``pid`` and of its descendants, with the core each last ran on."""
    out: dict[int, tuple[float, int]] = {}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for proc in procs:
        try:
            for thread in proc.threads():
                try:
                    core = psutil.Process(thread.id).cpu_num()
                except psutil.NoSuchProcess:
                    core = -1
                out[thread.id] = (thread.user_time + thread.system_time, core)
        except psutil.NoSuchProcess:
            continue
    return out


def _children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuShares:
    """A reading of the named processes' threads; ``since()`` reads again and reports the difference."""

    pids: dict[str, int]
    start: float
    threads: dict[str, dict[int, tuple[float, int]]]
    children: float

    @classmethod
    def take(cls, pids: dict[str, int]) -> CpuShares:
        return cls(dict(pids), time.monotonic(), {name: _thread_seconds(pid) for name, pid in pids.items()},
                   _children_seconds())

    def since(self) -> str:
        """Each process's cores since ``take`` (the busiest threads' in brackets, by the core they last
        ran on), then this process's children that ended meanwhile (e.g. a client it ran), if any."""
        wall = time.monotonic() - self.start
        parts = []
        for name, pid in self.pids.items():
            now = _thread_seconds(pid)
            used = {tid: (seconds - self.threads[name].get(tid, (0.0, -1))[0], core)
                    for tid, (seconds, core) in now.items()}
            top = sorted(used.values(), reverse=True)[:TOP_THREADS]
            threads = ", ".join(f"core {core}: {seconds / wall:.2f}" for seconds, core in top)
            parts.append(f"{name} {sum(s for s, _ in used.values()) / wall:.2f} ({threads})")
        if children := _children_seconds() - self.children:
            parts.append(f"ended children {children / wall:.2f}")
        return "cores used: " + "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("processes", nargs="+", metavar="NAME=PID")
    args = parser.parse_args()
    pids = {}
    for item in args.processes:
        name, _, pid = item.rpartition("=")
        if not pid.isdigit():
            raise SystemExit(f"expected NAME=PID, got {item!r}")
        pids[name or pid] = int(pid)
    shares = CpuShares.take(pids)
    time.sleep(args.seconds)
    print(shares.since())


if __name__ == "__main__":
    main()
