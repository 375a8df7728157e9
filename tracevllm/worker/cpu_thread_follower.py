"""Threads that follow the load: when another process takes one of the cores after start-up (or gives
it back), the worker notices and probes its thread count again (optimisation "cpu_thread_follower").

Start-up chooses the thread count once (``worker/cpu_threads.py``). A neighbour that starts later, a
build or a second server, keeps a core busy; the torch thread placed there gets half of it, and every
GEMM of two or more rows waits for that thread at its barrier (docs/perf-log.md#one-core-kept-busy).

What others use is cheap to read and the probe is not (tens of milliseconds, more beside a busy
core), so the follower reads and only then measures:

- At the start of a step, once ``CHECK_SECONDS`` have passed since its last look, it reads how much
  of the rank's cores other processes used meanwhile: the cores' busy time (``/proc/stat``, the
  hypervisor's steal included) less this process's own CPU time (``os.times``), in cores. What is
  left is ``free``.
- It probes again (``measure_cpu_threads``, the start-up's measurement) when the threads outnumber the
  free cores (``threads > free + SLACK``: a neighbour took a core our threads use; a thread sharing
  a core with a busy one gets half of it, so 2 threads beside a busy core see 1.5 free), and then
  only fewer threads than now are tried; or, with fewer threads than cores, when more than ``SLACK``
  of a core is free beyond the threads (the neighbour left), and then only more threads are tried.
  So a probe never undoes the change its reading asked for: one thread beside a busy core, with a
  client's bursts on top, reads fewer free cores than threads too, and a probe among all counts
  could then pick two at a moment when the neighbour was off the core.
- A probe that keeps the count (the load was bursty, or the cores are shared with this engine's own
  front end, or a client that stays after the neighbour left) doubles the wait before the next one,
  up to ``MAX_PROBE_WAIT``; a change resets it.

Each probe is a ``CpuThreadsProbe`` event: the trace draws it inside the step that paid for it, the
step-cost fits leave that step out, and a change is logged. With several ranks the follower is off:
their threads meet at every collective, and one rank alone cannot judge the count.
"""

from __future__ import annotations

import logging
import os
import time

from tracevllm.core.events import CpuThreadsProbe
from tracevllm.worker.cpu_threads import measure_cpu_threads, thread_counts

logger = logging.getLogger(__name__)

CHECK_SECONDS = 1.0  # the shortest window the load is read over (os.times counts in 10 ms ticks)
SLACK = 0.25  # cores: how far the threads may outnumber the free cores before a probe
MIN_PROBE_WAIT = 2.0  # seconds after a probe that changed the count (or the first) before the next
MAX_PROBE_WAIT = 60.0  # ... and the most it grows to while probes keep the count


def _busy_seconds(cores: set[int]) -> float | None:
    """CPU seconds the machine's ``cores`` spent busy since boot (every process, and the hypervisor's
    steal), from ``/proc/stat``; None where there is none (not Linux)."""
    try:
        with open("/proc/stat") as f:
            lines = f.readlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[:8])
            ticks += user + nice + system + irq + softirq + steal
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU seconds this process (all its threads) has used."""
    t = os.times()
    return t.user + t.system


class CpuThreadFollower:
    """Probes the rank's thread count again when other processes' load on its cores changes."""

    def __init__(self, num_threads: int, cores: int) -> None:
        self.num_threads = num_threads
        self.cores = cores
        self._cpus = os.sched_getaffinity(0)
        self._probe_wait = MIN_PROBE_WAIT
        self._last_probe = time.monotonic()
        self._window = self._read()

    @classmethod
    def for_rank(cls, num_threads: int, cores: int, world_size: int) -> CpuThreadFollower | None:
        """A follower, where one can work: one rank, more than one core, and a ``/proc/stat`` to read."""
        if world_size > 1 or cores < 2 or not hasattr(os, "sched_getaffinity") or _busy_seconds({0}) is None:
            return None
        return cls(num_threads, cores)

    def _read(self) -> tuple[float, float, float]:
        return time.monotonic(), _busy_seconds(self._cpus) or 0.0, _own_seconds()

    def others_load(self) -> float | None:
        """The cores' worth other processes used since the last call, once ``CHECK_SECONDS`` have
        passed (None before)."""
        start, busy0, own0 = self._window
        if time.monotonic() - start < CHECK_SECONDS:  # most steps: no file read
            return None
        now, busy, own = self._window = self._read()
        return max(0.0, (busy - busy0) - (own - own0)) / (now - start)

    def check(self) -> CpuThreadsProbe | None:
        """Called before each step: a probe's event when the load called for one and it ran, else None."""
        others = self.others_load()
        if others is None or time.monotonic() - self._last_probe < self._probe_wait:
            return None
        free = self.cores - others
        counts = thread_counts(self.cores)
        if self.num_threads > free + SLACK and self.num_threads > 1:
            reason = f"other processes used {others:.2f} of {self.cores} cores: fewer free than threads"
            counts = [n for n in counts if n <= self.num_threads]
        elif self.num_threads < self.cores and free - self.num_threads > SLACK:
            reason = f"other processes used {others:.2f} of {self.cores} cores: more are free than threads"
            counts = [n for n in counts if n >= self.num_threads]
        else:
            return None
        start_time, start = time.time(), time.perf_counter()  # timed as the step is
        before = self.num_threads
        choice = measure_cpu_threads(self.cores, counts)
        end_time = start_time + time.perf_counter() - start
        self.num_threads = choice.num_threads
        self._last_probe = time.monotonic()
        self._window = self._read()  # the probe's own work is not the next window's
        if choice.num_threads == before:
            self._probe_wait = min(max(2 * self._probe_wait, MIN_PROBE_WAIT), MAX_PROBE_WAIT)
        else:
            self._probe_wait = MIN_PROBE_WAIT
            logger.warning("CPU threads: %d -> %d, because %s; %s.", before, choice.num_threads, reason, choice.reason)
        return CpuThreadsProbe(start_time, end_time, before, choice.num_threads, round(others, 3), f"{reason}; {choice.reason}")
