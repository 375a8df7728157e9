"""The worker's CPU thread count: the fastest of the rank's share, half of it, ..., one."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from tracevllm.worker import cpu_threads
from tracevllm.worker.cpu_threads import choose_cpu_threads


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def fake_timings(monkeypatch, timings: dict[int, float]) -> list[int]:
    measured = []

    def gemm_seconds(n: int, *operands) -> float:
        measured.append(n)
        return timings[n]

    monkeypatch.setattr(cpu_threads, "_gemm_seconds", gemm_seconds)
    return measured


def test_all_cores_when_they_are_fastest(monkeypatch, caplog):
    measured = fake_timings(monkeypatch, {8: 0.1e-3, 4: 0.2e-3, 2: 0.4e-3, 1: 0.8e-3})
    with caplog.at_level(logging.INFO, logger="tracevllm.worker.cpu_threads"):
        choice = choose_cpu_threads(None, 8)
    assert measured == [8, 4, 2, 1] * cpu_threads.PROBE_ROUNDS  # in turns
    assert (choice.num_threads, choice.cores) == (8, 8) and torch.get_num_threads() == 8
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_busy_core_makes_it_fewer_threads_with_a_warning(monkeypatch, caplog):
    # As measured on a 2-core machine with one core kept busy: 2 threads wait at every barrier.
    fake_timings(monkeypatch, {2: 16e-3, 1: 0.6e-3})
    with caplog.at_level(logging.INFO, logger="tracevllm.worker.cpu_threads"):
        choice = choose_cpu_threads(None, 2)
    assert choice.num_threads == 1 and torch.get_num_threads() == 1
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "1 of 2 cores" in warning[0] and "--cpu-threads" in warning[0]
    assert "16.00 ms on 2, 0.60 ms on 1" in choice.reason


def test_a_fewer_thread_count_must_win_clearly(monkeypatch):
    fake_timings(monkeypatch, {4: 1.0e-3, 2: 0.95e-3, 1: 2e-3})  # 5 % is noise
    assert choose_cpu_threads(None, 4).num_threads == 4
    fake_timings(monkeypatch, {2: 0.55e-3, 1: 0.48e-3})  # a moment's noise seen on an idle 2-core machine
    assert choose_cpu_threads(None, 2).num_threads == 2


def test_a_moment_of_noise_falls_on_every_count(monkeypatch):
    # One turn disturbed: the median of the turns does not see it.
    turns = iter([0.4e-3, 0.5e-3, 5e-3, 0.5e-3] + [0.4e-3, 0.5e-3] * (cpu_threads.PROBE_ROUNDS - 2))
    monkeypatch.setattr(cpu_threads, "_gemm_seconds", lambda n, *operands: next(turns))
    choice = choose_cpu_threads(None, 2)
    assert choice.num_threads == 2 and "0.40 ms on 2, 0.50 ms on 1" in choice.reason


def test_the_user_choice_is_kept_unmeasured(monkeypatch):
    measured = fake_timings(monkeypatch, {})
    assert choose_cpu_threads(3, 2).num_threads == 3 and torch.get_num_threads() == 3
    assert choose_cpu_threads(None, 1).num_threads == 1
    assert measured == []


def test_a_turn_lasts_long_enough_for_a_neighbour_to_take_its_share(monkeypatch):
    """A turn is timed whole over PROBE_TURN_SECONDS (past the few milliseconds the scheduler lets a
    woken thread run ahead of a busy neighbour), and gives the mean time of a product."""
    calls = []
    monkeypatch.setattr(cpu_threads, "PROBE_TURN_SECONDS", 0.05)
    a, b = torch.randn(cpu_threads.PROBE_ROWS, 64), torch.randn(64, 64)
    start = time.perf_counter()
    mean = cpu_threads._gemm_seconds(1, a, b)
    elapsed = time.perf_counter() - start
    assert elapsed >= 0.05 and 0 < mean < 0.05
    measured = fake_timings(monkeypatch, {2: 1e-3, 1: 1e-3})
    cpu_threads.measure_cpu_threads(2, [1, 2, 1])
    assert measured == [2, 1] * cpu_threads.PROBE_ROUNDS  # the counts asked for, largest first, once each


def test_the_real_measurement_sets_a_count_within_the_share():
    choice = choose_cpu_threads(None, 2)
    assert choice.num_threads in (1, 2) and torch.get_num_threads() == choice.num_threads
