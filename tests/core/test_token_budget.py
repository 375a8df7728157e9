"""The server's CPU token budget: a line fitted through two timed dummy steps, then the tokens that fit."""

from __future__ import annotations

import time

import pytest

from tracevllm.core.sched.token_budget import PROBE_TOKENS, StepCost, fit_token_budget, measure_step_cost


def test_the_fit_recovers_a_linear_step_cost():
    ran = []

    def dummy_step(tokens: int) -> int:  # 20 ms + 0.5 ms a token
        ran.append(tokens)
        time.sleep(0.02 + 0.0005 * tokens)
        return tokens

    cost = measure_step_cost(dummy_step)
    assert sorted(set(ran)) == sorted(PROBE_TOKENS)
    assert cost.per_token_s == pytest.approx(0.0005, rel=0.3)
    assert cost.fixed_s == pytest.approx(0.02, abs=0.01)


def test_a_step_capped_by_the_kv_cache_is_fitted_on_the_tokens_it_ran():
    cost = measure_step_cost(lambda tokens: (time.sleep(0.001 * min(tokens, 64)), min(tokens, 64))[1])
    assert cost.per_token_s == pytest.approx(0.001, rel=0.3)


def test_the_budget_is_what_fits_the_target_within_its_bounds():
    cost = StepCost(fixed_s=0.1, per_token_s=0.002)
    assert fit_token_budget(cost, 0.5, max_num_seqs=16, ceiling=2048) == 192  # 200 tokens, in 16s
    assert cost.seconds(192) <= 0.5
    assert fit_token_budget(cost, 0.5, max_num_seqs=256, ceiling=2048) == 256  # every running row decodes
    assert fit_token_budget(StepCost(0.0, 1e-6), 0.5, max_num_seqs=16, ceiling=2048) == 2048
    assert fit_token_budget(StepCost(1.0, 0.001), 0.5, max_num_seqs=8, ceiling=2048) == 8  # over already
