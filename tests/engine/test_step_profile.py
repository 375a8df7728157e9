"""``engine/step_profile.py``: the start-up times one dummy step per ladder size, within the run's
limits, and keeps the fastest run of each."""

from __future__ import annotations

import pytest

from tracevllm.engine import step_profile
from tracevllm.engine.step_profile import ladder_profile, profile_attributes


def _fake_step(limit_tokens: int, limit_reqs: int, calls: list[tuple[int, int]]):
    """A dummy step that runs at most ``limit_tokens`` tokens a prompt and ``limit_reqs`` prompts (as the
    runner cuts them to the KV cache and the limits), and records each call."""

    def run(num_tokens: int, num_reqs: int) -> int:
        calls.append((num_tokens, num_reqs))
        return min(num_tokens, limit_tokens) * min(num_reqs, limit_reqs)

    return run


def test_the_ladder_stops_at_the_budget_and_at_max_num_seqs(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(step_profile.time, "perf_counter", lambda: float(next(clock)))
    calls: list[tuple[int, int]] = []
    profile = ladder_profile(_fake_step(10_000, 10_000, calls), max_num_batched_tokens=128, max_num_seqs=12)
    a = profile_attributes(profile)
    assert a["profile.prefill_tokens"] == [16, 64, 128]  # 256 is over the budget: the budget instead
    assert a["profile.decode_rows"] == [1, 4, 12]
    assert calls == [(n, 1) for n in (16, 16, 64, 64, 128, 128)] + [(1, n) for n in (1, 1, 4, 4, 12, 12)]
    assert a["profile.prefill_seconds"] == a["profile.decode_seconds"] == [1.0] * 3  # each call one tick


def test_a_large_budget_times_the_ladder_only():
    calls: list[tuple[int, int]] = []
    profile = ladder_profile(_fake_step(10_000, 10_000, calls), max_num_batched_tokens=8192, max_num_seqs=256)
    a = profile_attributes(profile)
    assert a["profile.prefill_tokens"] == list(step_profile.PREFILL_TOKENS)
    assert a["profile.decode_rows"] == list(step_profile.DECODE_ROWS)


def test_sizes_the_limits_cut_down_are_one_point_with_the_fastest_run(monkeypatch):
    """A KV cache of 40 tokens cuts the 64- and 256-token chunks to 40: one point, the fastest of its four
    runs."""
    durations = iter([0.5, 0.4, 0.9, 0.7, 0.8, 0.6] + [0.1] * 8)
    now = [0.0]

    def perf_counter() -> float:
        return now[0]

    def run(num_tokens: int, num_reqs: int) -> int:
        now[0] += next(durations)
        return min(num_tokens, 40) * num_reqs

    monkeypatch.setattr(step_profile.time, "perf_counter", perf_counter)
    a = profile_attributes(ladder_profile(run, max_num_batched_tokens=2048, max_num_seqs=64))
    assert a["profile.prefill_tokens"] == [16, 40]
    assert a["profile.prefill_seconds"] == pytest.approx([0.4, 0.6])
