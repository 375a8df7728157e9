"""``viz/step_cost.py`` and ``tracevllm traces fit``: a step-cost model recovers known coefficients
from synthetic steps and names their spikes; on a recorded trace it fits finite coefficients and
scores them on held-out steps."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from tracevllm.entrypoints.cli import main as cli
from viz.model import Step
from viz.step_cost import FEATURES, MIN_R2, BatchFeatures, StepCostModel, describe, evaluate

# intercept 2 ms, 50 µs per prefill token, 300 µs per decode row, 20 ns per context token, 3 ns per
# prefill attention pair, 500 µs per prefilling request, 4 ms per step that prefills
TRUE = (2e-3, 50e-6, 300e-6, 20e-9, 3e-9, 500e-6, 4e-3)
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
    model = StepCostModel.fit(steps)
    assert min(model.coefficients) >= 0
    for s in steps:
        assert model.predict_step(s) == pytest.approx(s.end - s.start, rel=1e-6)


def test_traces_fit_on_a_recorded_trace(recording, capsys):
    assert cli(["traces", "fit", recording.trace_dir]) == 0
    text = capsys.readouterr().out
    assert "R²" in text and "prefill tokens" in text and "µs per token" in text
    assert cli(["traces", "fit", recording.trace_dir, "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert [f["name"] for f in fit["features"]] == list(FEATURES)
    assert all(math.isfinite(f["coefficient"]) and f["coefficient"] >= 0 for f in fit["features"])
    assert isinstance(fit["r2"], float) and fit["num_held_out"] == fit["num_steps"] // 5
    assert all(isinstance(s["step"], int) for s in fit["spikes"])


def test_traces_fit_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(["traces", "fit", "--help"])
    assert exit_.value.code == 0 and "--json" in capsys.readouterr().out
