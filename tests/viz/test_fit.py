"""The step-cost model (``tracevllm/step_cost.py``) and ``tracevllm traces fit`` (``viz/fit.py``): it
recovers known coefficients from synthetic steps and names their spikes, and shares a step among its
requests by the terms each causes; on a recorded trace it fits finite coefficients and scores them on
held-out steps."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from tracevllm.entrypoints.cli import main as cli
from viz.model import Step
from tracevllm.step_cost import FEATURES, BatchFeatures, StepCostModel, StepProfile
from viz.fit import MIN_R2, describe, evaluate, fit_steps, predict_step

# intercept 2 ms, no profile, 50 µs per prefill token, 300 µs per decode row, 20 ns per context token,
# 3 ns per prefill attention pair, 500 µs per prefilling request, 4 ms per step that prefills
TRUE = (2e-3, 0.0, 50e-6, 300e-6, 20e-9, 3e-9, 500e-6, 4e-3)
SPIKES = (7, 51, 133)


def _step(number: int, start: float, num_tokens: list[int], is_decode: list[bool], computed: list[int],
          extra_s: float = 0.0) -> Step:
    """A step whose duration is ``TRUE``'s prediction for its batch, plus ``extra_s``."""
    duration = StepCostModel(TRUE).predict(BatchFeatures.of(num_tokens, is_decode, computed)) + extra_s
    return Step(number, start, start + duration, tuple(f"r{i}" for i in range(len(num_tokens))), tuple(num_tokens),
                tuple(is_decode), (), 1024, sum(num_tokens), 0, 0, 0.0, 0, 0, {}, {}, {}, {}, tuple(computed))


def _synthetic_steps(n: int = 200) -> list[Step]:
    """Mixed batches (decodes with long contexts, prompt chunks); the steps in ``SPIKES`` decode one
    request and stall 50 ms."""
    rng, steps, start = random.Random(0), [], 0.0
    for number in range(1, n + 1):
        if number in SPIKES:
            batch = [(1, True, 100)]
        else:
            batch = [(1, True, rng.randrange(10, 800)) for _ in range(rng.randrange(0, 17))]
            batch += [(rng.randrange(1, 257), False, rng.randrange(0, 300)) for _ in range(rng.randrange(0, 4))]
            batch = batch or [(rng.randrange(1, 257), False, 0)]
        tokens, decode, computed = (list(x) for x in zip(*batch))
        steps.append(_step(number, start, tokens, decode, computed, 0.05 if number in SPIKES else 0.0))
        start = steps[-1].end
    return steps


def test_the_fit_recovers_known_coefficients_and_names_the_spikes():
    evaluation = evaluate(_synthetic_steps())
    assert evaluation.model.coefficients == pytest.approx(TRUE, rel=1e-6)
    assert [s.step for s in evaluation.spikes] == list(SPIKES)
    assert (evaluation.num_steps, evaluation.num_fitted, evaluation.num_held_out) == (200, 160, 40)
    assert evaluation.r2 == pytest.approx(1.0) and evaluation.median_relative_error < 1e-6


def test_a_fit_that_explains_little_says_so_and_what_to_do():
    """Step durations unrelated to their batches (a machine busy with something else): the held-out R²
    falls below ``MIN_R2`` and the report warns, with what to record instead; the clean run does not."""
    rng, noisy = random.Random(1), []
    for s in _synthetic_steps():
        start = noisy[-1].end if noisy else 0.0
        noisy.append(dataclasses.replace(s, start=start, end=start + rng.uniform(0.05, 0.15)))
    bad, good = evaluate(noisy), evaluate(_synthetic_steps())
    assert bad.r2 is not None and bad.r2 < MIN_R2 <= good.r2
    text = describe(bad, "noisy/")
    assert f"warning: this model explains little: R² {bad.r2:.3f} on the held-out steps (below {MIN_R2})" in text
    assert "Record a longer run, with more varied steps" in text and "on a quieter machine" in text
    assert bad.as_dict()["warning"] == bad.warning and bad.warning in text
    assert good.warning is None and good.as_dict()["warning"] is None and "warning" not in describe(good, "good/")


def test_coefficients_stay_non_negative():
    """Decode rows and their context move together when every step decodes rows of one length: least
    squares alone could trade one for a negative other; the fit keeps both >= 0 and still predicts
    the steps."""
    steps = [_step(i, i * 0.01, [1] * k, [True] * k, [50] * k) for i, k in enumerate(range(1, 40), start=1)]
    model = fit_steps(steps)
    assert min(model.coefficients) >= 0
    for s in steps:
        assert predict_step(model, s) == pytest.approx(s.end - s.start, rel=1e-6)


def _bent_seconds(tokens: int, rows: int) -> float:
    """A CPU-like step: a prompt chunk's cost bends (a small chunk costs more a token: its GEMMs are
    less efficient), a decode batch's too; plus 30 ns per context token."""
    if tokens:
        return 0.02 + 0.4e-3 * tokens ** 0.8
    return 0.012 + 0.6e-3 * rows ** 0.85


def _bent_step(number: int, start: float, batch: list[tuple[int, bool, int]]) -> Step:
    tokens, decode, computed = (list(x) for x in zip(*batch))
    prefill = sum(n for n, d in zip(tokens, decode) if not d)
    duration = _bent_seconds(prefill + sum(decode) if prefill else 0, sum(decode)) + 30e-9 * (sum(tokens) + sum(computed))
    return Step(number, start, start + duration, tuple(f"r{i}" for i in range(len(tokens))), tuple(tokens),
                tuple(decode), (), 1024, sum(tokens), 0, 0, 0.0, 0, 0, {}, {}, {}, {}, tuple(computed))


def test_a_step_profile_prices_batches_the_run_never_had():
    """A run whose prompt chunks all hold 256 tokens and whose decode steps run 10-30 rows, on a machine
    whose step cost bends with the batch's size: fitted with the start-up's profile (timed 10 % faster,
    as a start-up on a quieter moment would), the model prices a 64-token chunk and a one-row decode
    step within 2 %; the linear terms alone, fitted on the same steps, miss them by over 10 %."""
    rng, steps, start = random.Random(3), [], 0.0
    for number in range(1, 201):
        batch = [(1, True, rng.randrange(50, 600)) for _ in range(rng.randrange(10, 31))]
        if number % 4 == 0:
            batch = [(256, False, rng.choice((0, 256, 512)))]
        steps.append(_bent_step(number, start, batch))
        start = steps[-1].end
    profile = StepProfile(tuple((n, 0.9 * _bent_seconds(n, 0)) for n in (16, 32, 64, 128, 256)),
                          tuple((n, 0.9 * _bent_seconds(0, n)) for n in (1, 2, 4, 8, 16, 32)))
    profiled, linear = fit_steps(steps, profile), fit_steps(steps)
    assert linear.profile is None and linear.coefficients[FEATURES.index("profiled_step")] == 0
    unseen = [[(64, False, 0)], [(1, True, 200)], [(32, False, 0), (1, True, 100)]]
    for batch in unseen:
        real = _bent_step(0, 0.0, batch)
        real_s = real.end - real.start
        assert predict_step(profiled, real) == pytest.approx(real_s, rel=0.02), batch
    assert max(abs(predict_step(linear, s := _bent_step(0, 0.0, b)) - (s.end - s.start)) / (s.end - s.start)
               for b in unseen) > 0.10


def test_where_the_steps_cannot_tell_the_terms_apart_the_profile_keeps_its_scale():
    """Every step decodes 3 requests of 100 context tokens (the profiled step plus 4 ms, 2 % noise): the
    intercept, the profiled step and the context are then one column three times, and any split fits.
    The profile's prior keeps the profiled step at 1, so a batch of 1, 10 or 16 rows is priced by the
    start-up's slope (without it the fit put all of it on the context: 203 ms for 10 rows)."""
    profile = StepProfile(((16, 0.08), (64, 0.15), (256, 0.42)), ((1, 0.055), (4, 0.058), (16, 0.082), (32, 0.12)))
    rng = random.Random(0)
    batch = BatchFeatures.of([1] * 3, [True] * 3, [100] * 3)
    model = StepCostModel.fit([batch] * 200, [(0.004 + profile.seconds(batch)) * (1 + rng.gauss(0, 0.02))
                                              for _ in range(200)], profile)
    assert model.coefficients[FEATURES.index("profiled_step")] == pytest.approx(1.0, abs=0.01)
    for rows in (1, 10, 16):
        other = BatchFeatures.of([1] * rows, [True] * rows, [100] * rows)
        assert model.predict(other) == pytest.approx(0.004 + profile.seconds(other), rel=0.02), rows


def test_a_step_profile_interpolates_between_its_sizes_and_extends_beyond_them():
    profile = StepProfile(((16, 0.010), (32, 0.014), (64, 0.020)), ((1, 0.005), (4, 0.008)))
    prefill = BatchFeatures.of
    assert profile.seconds(prefill([48], [False], [0])) == pytest.approx(0.017)  # half-way from 32 to 64
    assert profile.seconds(prefill([8], [False], [0])) == pytest.approx(0.010)  # below the ladder: its first
    assert profile.seconds(prefill([96], [False], [0])) == pytest.approx(0.026)  # beyond: the last slope
    assert profile.seconds(prefill([60, 1, 1, 1, 1], [False, True, True, True, True], [0, 9, 9, 9, 9])) == \
        pytest.approx(0.020)  # a mixed step: a chunk of all its tokens
    assert profile.seconds(prefill([1, 1], [True, True], [5, 5])) == pytest.approx(0.006)  # two decode rows


def test_traces_fit_on_a_recorded_trace(recording, capsys):
    assert cli(["traces", "fit", recording.trace_dir]) == 0
    text = capsys.readouterr().out
    assert "R²" in text and "with the start-up's step profile" in text and "the profiled step" in text
    assert cli(["traces", "fit", recording.trace_dir, "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert [f["name"] for f in fit["features"]] == list(FEATURES)
    assert fit["profile"]["prefill"][0][0] == 16 and fit["profile"]["decode"][0][0] == 1
    assert all(math.isfinite(f["coefficient"]) and f["coefficient"] >= 0 for f in fit["features"])
    assert isinstance(fit["r2"], float) and fit["num_held_out"] == fit["num_steps"] // 5
    assert all(isinstance(s["step"], int) for s in fit["spikes"])


def test_traces_fit_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(["traces", "fit", "--help"])
    assert exit_.value.code == 0 and "--json" in capsys.readouterr().out


def test_shares_charge_each_term_to_the_requests_that_cause_it():
    """Without a profile every term is a sum over the requests, so a request's share is its own part of
    the prediction: the prompt chunk pays its tokens, its attention and the step's prefill path; of two
    decode rows, the one with the longer context pays more."""
    model = StepCostModel(TRUE)
    tokens, decode, computed = [200, 1, 1], [False, True, True], [0, 10, 1000]
    shares = model.shares(tokens, decode, computed)
    predicted = model.predict(BatchFeatures.of(tokens, decode, computed))
    intercept, _, prefill_token, row, context, pair, prefilling, prefill_step = TRUE
    chunk = intercept / 3 + 200 * prefill_token + 200 * context + 200 * 200 * pair + prefilling + prefill_step
    assert shares[0] * predicted == pytest.approx(chunk)
    assert shares[2] * predicted - shares[1] * predicted == pytest.approx(990 * context)
    assert sum(shares) == pytest.approx(1.0)
    by_profile = StepCostModel.from_profile(StepProfile(((16, 0.01), (256, 0.1))))
    assert by_profile.shares(tokens, decode, computed) == pytest.approx([200 / 202, 1 / 202, 1 / 202])
    assert StepCostModel((0.0,) * len(FEATURES)).shares(tokens, decode, computed) == pytest.approx([1 / 3] * 3)
    assert model.shares([], [], []) == []  # a step that ran no request (it only completed a batch)
