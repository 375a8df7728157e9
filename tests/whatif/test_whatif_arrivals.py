"""``tracevllm/whatif/arrivals.py``: arrivals at another rate, resampled workloads, and an offline run's
first step after all its prompts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tracevllm.whatif.arrivals import plan_arrivals
from viz.workload import RecordedRequest


def _request(i: int, arrival: float, hashes: tuple[str, ...], parent: str | None = None) -> RecordedRequest:
    return RecordedRequest(str(i), parent or str(i), 1, arrival, arrival + 0.01, 40, 16, hashes, 32, 0, False, False,
                           0, 8, "length")


# A served run: a request a second, the first two sharing a system prompt block.
SERVED = [_request(0, 0.0, ("sys", "a")), _request(1, 1.0, ("sys", "b")), _request(2, 2.0, ("c",)),
          _request(3, 3.0, ("d",))]


def test_recorded_arrivals_are_kept_and_scaled():
    plan = plan_arrivals(SERVED, first_step=0.02)
    assert [a.arrival for a in plan.arrivals] == [0.0, 1.0, 2.0, 3.0]
    assert [a.queued for a in plan.arrivals] == pytest.approx([0.01, 1.01, 2.01, 3.01])
    assert plan.first_step == pytest.approx(0.02)
    doubled = plan_arrivals(SERVED, first_step=0.02, arrival_scale=2.0)
    assert [a.arrival for a in doubled.arrivals] == [0.0, 0.5, 1.0, 1.5]
    assert [a.queued - a.arrival for a in doubled.arrivals] == pytest.approx([0.01] * 4)


def test_an_offline_runs_first_step_waits_for_its_prompts():
    offline = [_request(i, 0.001 * i, (f"h{i}",)) for i in range(10)]  # all queued before the first step
    plan = plan_arrivals(offline, first_step=0.5)
    assert plan.first_step == pytest.approx(0.5)
    more = plan_arrivals(offline, first_step=0.5, num_requests=100)
    assert more.first_step > max(a.queued for a in more.arrivals)


def test_a_resampled_workload_keeps_the_rate_and_the_shared_blocks():
    plan = plan_arrivals(SERVED, first_step=0.02, num_requests=200, seed=1)
    assert len(plan.arrivals) == 200 and len({a.request_id for a in plan.arrivals}) == 200
    assert all(a.arrival == pytest.approx(float(i)) for i, a in enumerate(plan.arrivals))  # every gap was 1 s
    for i, a in enumerate(plan.arrivals):
        (sample,) = a.samples
        original = a.request_id.split("-", 1)[1]
        assert a.request_id == f"{i}-{original}" and sample.request_id == a.request_id
        if original in ("0", "1"):  # the system prompt stays shared, the question is the copy's own
            assert sample.prompt_block_hashes == ("sys", f"{'ab'[int(original)]}-{i}")
        else:
            assert sample.prompt_block_hashes[0].endswith(f"-{i}")
    assert plan_arrivals(SERVED, 0.02, num_requests=200, seed=1) == plan  # seeded


def test_samples_stay_together():
    samples = [replace(_request(0, 0.0, ("x",)), request_id=f"{i}_p", parent_request_id="p", n=2) for i in range(2)]
    plan = plan_arrivals(samples, first_step=0.1, num_requests=3)
    assert [len(a.samples) for a in plan.arrivals] == [2, 2, 2]
    assert [s.request_id for s in plan.arrivals[1].samples] == ["0_1-p", "1_1-p"]


def test_bad_loads_are_refused():
    with pytest.raises(ValueError, match="--arrival-scale must be > 0"):
        plan_arrivals(SERVED, 0.02, arrival_scale=0)
    with pytest.raises(ValueError, match="--num-requests must be >= 1"):
        plan_arrivals(SERVED, 0.02, num_requests=0)
