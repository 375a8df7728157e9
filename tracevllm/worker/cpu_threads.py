"""How many torch threads a rank runs on a CPU: as many as help, measured at start-up.

torch's GEMMs split each product over OpenMP threads that meet at a barrier, so a product is as slow
as its slowest thread. When another process keeps one of the cores busy, the thread placed there
waits for the scheduler, and every GEMM of two or more rows waits with it: one thread per free core
(docs/perf-log.md#source-figures).

So before loading the model the worker times a small multi-row GEMM (``PROBE_ROWS`` x ``PROBE_DIM``
times ``PROBE_DIM`` x ``PROBE_DIM``, float32) on the rank's share of the cores, on half of it, ... down
to one thread, keeps the fastest, and warns when that is fewer than the share. ``cpu_threads``
(``--cpu-threads``) skips the measurement. A machine that gets busy later, or quiet again, is noticed
by ``worker/cpu_thread_follower.py``, which measures again.

The counts are timed in turns, ``PROBE_ROUNDS`` rounds of each, so that a moment's disturbance
(another process's burst of work) falls on all of them rather than on one. A busy core makes two
threads many times slower than one, a moment's noise only a few per cent, so a smaller count must be
clearly faster (``WIN_MARGIN``) to be chosen.

A turn runs GEMMs for at least ``PROBE_TURN_SECONDS`` and is timed whole (its mean, not a median of
a few products): Linux lets a thread that was asleep run ahead of a busy neighbour for a few
milliseconds, and only a turn that outlasts that credit sees the neighbour take its turns on the
core, as it does in a step (docs/perf-log.md#threads-beside-a-busy-core).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

PROBE_ROWS = 16  # a GEMM of one row does not wait at the barrier; two or more do
PROBE_DIM = 1024
PROBE_ROUNDS = 3  # each count is timed once a round, in turns
PROBE_TURN_SECONDS = 0.02  # a count's turn: GEMMs for at least this long
# A smaller thread count must take at most this fraction of a larger one's time to be chosen over it.
WIN_MARGIN = 0.8


@dataclass(frozen=True)
class CpuThreads:
    """The threads chosen for this rank, out of ``cores`` (its share), and why."""

    num_threads: int
    cores: int
    reason: str


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _gemm_seconds(num_threads: int, a: torch.Tensor, b: torch.Tensor) -> float:
    """One turn of a thread count: ``a @ b`` on that many threads, again and again for at least
    ``PROBE_TURN_SECONDS``; the mean time a product took."""
    torch.set_num_threads(num_threads)
    a @ b  # the thread pool resized
    products, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < PROBE_TURN_SECONDS:
        a @ b
        products += 1
    return elapsed / products


def thread_counts(cores: int) -> list[int]:
    """The counts a probe tries: ``cores``, half of it, ..., 1."""
    counts = [cores]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


def measure_cpu_threads(cores: int, counts: list[int] | None = None) -> CpuThreads:
    """The fastest of ``counts`` (default: ``cores``, ``cores // 2``, ..., 1) on a small multi-row GEMM,
    now; torch's thread count is left set to it. A smaller count must beat a larger one clearly."""
    counts = sorted(set(counts or thread_counts(cores)), reverse=True)
    a, b = torch.randn(PROBE_ROWS, PROBE_DIM), torch.randn(PROBE_DIM, PROBE_DIM)
    turns: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(PROBE_ROUNDS):
        for n in counts:
            turns[n].append(_gemm_seconds(n, a, b))
    timings = {n: statistics.median(t) for n, t in turns.items()}
    best = counts[0]
    for n in counts[1:]:
        if timings[n] < WIN_MARGIN * timings[best]:
            best = n
    torch.set_num_threads(best)
    measured = ", ".join(f"{timings[n] * 1e3:.2f} ms on {n}" for n in counts)
    return CpuThreads(best, cores, f"a {PROBE_ROWS}-row GEMM took {measured}")


def choose_cpu_threads(requested: int | None, cores: int) -> CpuThreads:
    """Set torch's thread count for this process: ``requested`` if given, else ``measure_cpu_threads``;
    returns the choice, logged."""
    if requested is not None:
        torch.set_num_threads(requested)
        choice = CpuThreads(requested, cores, "set by cpu_threads")
        logger.info("CPU threads: %d (set by --cpu-threads / cpu_threads; %d cores here)", requested, cores)
        return choice
    if cores == 1:
        torch.set_num_threads(1)
        return CpuThreads(1, 1, "one core for this rank")
    choice = measure_cpu_threads(cores)
    if choice.num_threads < cores:
        reason = f"{choice.reason}: other processes keep some of the {cores} cores busy, so threads on them wait"
        logger.warning("CPU threads: %d of %d cores, because %s. Free the cores for more speed, or set the "
                       "count with --cpu-threads / LLM(cpu_threads=...).", choice.num_threads, cores, reason)
        return CpuThreads(choice.num_threads, cores, reason)
    logger.info("CPU threads: %d (all %d cores this rank may use; %s)", cores, cores, choice.reason)
    return choice
