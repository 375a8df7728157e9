"""The server's CPU token budget: two prompt chunks timed at start-up, read by the step-cost model,
then the most tokens whose chunk fits the target."""

from __future__ import annotations

import time

import pytest

from tracevllm.core.sched.token_budget import PROBE_TOKENS, fit_token_budget, seconds_per_token
from tracevllm.engine.step_profile import profile_steps
from tracevllm.step_cost import BatchFeatures, StepCostModel, StepProfile


def test_the_probes_recover_a_linear_step_cost():
    ran = []

    def dummy_step(tokens: int, requests: int) -> int:  # 20 ms + 0.5 ms a token
        ran.append((tokens, requests))
        time.sleep(0.02 + 0.0005 * tokens)
        return tokens

    model = StepCostModel.from_profile(profile_steps(dummy_step, PROBE_TOKENS))
    assert sorted(set(ran)) == [(n, 1) for n in PROBE_TOKENS]
    assert seconds_per_token(model) == pytest.approx(0.0005, rel=0.3)
    assert model.predict(BatchFeatures.prompt_chunk(0)) == pytest.approx(0.02 + 0.0005 * 32, abs=0.01)  # no cheaper


def test_a_step_capped_by_the_kv_cache_is_read_at_the_tokens_it_ran():
    profile = profile_steps(lambda tokens, _: (time.sleep(0.001 * min(tokens, 64)), min(tokens, 64))[1], PROBE_TOKENS)
    assert [n for n, _ in profile.prefill] == [32, 64]
    model = StepCostModel.from_profile(profile)
    assert model.predict(BatchFeatures.prompt_chunk(128)) == pytest.approx(0.128, rel=0.3)


def _line(fixed: float, per_token: float) -> StepCostModel:
    return StepCostModel.from_profile(StepProfile(tuple((n, fixed + per_token * n) for n in PROBE_TOKENS)))


def test_the_budget_is_what_fits_the_target_within_its_bounds():
    model = _line(0.1, 0.002)
    assert fit_token_budget(model, 0.5, max_num_seqs=16, ceiling=2048) == 192  # 200 tokens, in 16s
    assert model.predict(BatchFeatures.prompt_chunk(192)) <= 0.5 < model.predict(BatchFeatures.prompt_chunk(208))
    assert fit_token_budget(model, 0.5, max_num_seqs=256, ceiling=2048) == 256  # every running row decodes
    assert fit_token_budget(_line(0.0, 1e-6), 0.5, max_num_seqs=16, ceiling=2048) == 2048
    assert fit_token_budget(_line(1.0, 0.001), 0.5, max_num_seqs=8, ceiling=2048) == 8  # over already
    assert fit_token_budget(_line(0.1, 0.002), 0.5, max_num_seqs=16, ceiling=100) == 100  # the ceiling, not a granule
