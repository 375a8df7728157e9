"""What an engine step costs, from its batch: a least-squares model fitted on a trace's steps.

``tracevllm traces fit DIR`` fits it and says how well it predicts; a simulated engine will use it as
its clock (``StepCostModel.predict``). A step's duration (its ``engine_step`` span: the four stages)
is modelled as::

    duration = intercept + a * prefill tokens + b * decode rows + c * context tokens + d * requests

- **prefill tokens**: the tokens of the requests that prefill in the step (prompt chunks, and
  recomputation after a preemption);
- **decode rows**: the requests that decode (one token each);
- **context tokens**: every scheduled request's context, summed: the tokens whose KV it had before
  the step (``step.req_num_computed_tokens``) plus its new ones, all of which its attention reads;
- **requests**: the batch size (each request's inputs, sampling and output cost host time).

It describes one machine and one model: the run it came from. Every coefficient is kept ≥ 0 (a step
cannot get cheaper by doing more), so that a batch bigger than any recorded one is never predicted
to be free. The fit is the least-squares one under that constraint: with five coefficients, the best
unconstrained fit on each of the 31 subsets of them, among those that come out all ≥ 0.

A **spike** is a step that took more than ``SPIKE_RATIO`` times its prediction and ``SPIKE_MIN_S``
more (a garbage collection, a first-time compilation, another process on the cores). One stall would
drag every coefficient, so the fit is made twice: the second time without the first fit's spikes.

``evaluate`` holds every ``HOLD_OUT``-th step out of the fit (steps 5, 10, 15, ... of those that ran
tokens) and scores the model on them: R² and the median relative error, spikes aside (they are listed
on their own).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracevllm.tracing.schema import Attr
from viz.model import Step

# The model's terms, each with the unit of its coefficient (seconds per unit of the feature).
FEATURES = ("intercept", "prefill_tokens", "decode_rows", "context_tokens", "requests")
UNITS = {"intercept": "s per step", "prefill_tokens": "s per token", "decode_rows": "s per row",
         "context_tokens": "s per token", "requests": "s per request"}
SPIKE_RATIO = 3.0
SPIKE_MIN_S = 0.005
HOLD_OUT = 5


@dataclass(frozen=True, slots=True)
class BatchFeatures:
    """What a step's batch does, as the model reads it."""

    prefill_tokens: int
    decode_rows: int
    context_tokens: int
    requests: int

    @staticmethod
    def of(num_tokens: Sequence[int], is_decode: Sequence[bool], num_computed_tokens: Sequence[int]) -> BatchFeatures:
        """From the batch's requests: each one's new tokens, whether it decodes, and its tokens computed
        before the step."""
        return BatchFeatures(
            prefill_tokens=sum(n for n, d in zip(num_tokens, is_decode) if not d),
            decode_rows=sum(is_decode),
            context_tokens=sum(num_tokens) + sum(num_computed_tokens),
            requests=len(num_tokens),
        )

    def row(self) -> list[float]:
        """The model's inputs, in ``FEATURES`` order (1 for the intercept)."""
        return [1.0, self.prefill_tokens, self.decode_rows, self.context_tokens, self.requests]


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Seconds per unit of each of ``FEATURES``, all ≥ 0."""

    coefficients: tuple[float, ...]

    @staticmethod
    def features(step: Step) -> BatchFeatures:
        """The recorded step's batch (ValueError for a trace without each request's computed tokens)."""
        if len(step.req_num_computed_tokens) != len(step.req_ids):
            raise ValueError(f"step {step.number} lacks {Attr.STEP_REQ_NUM_COMPUTED_TOKENS}: the trace was "
                             "recorded before steps carried it (trace format 1); record the run again")
        return BatchFeatures.of(step.req_num_tokens, step.req_is_decode, step.req_num_computed_tokens)

    @staticmethod
    def fit(steps: Sequence[Step]) -> StepCostModel:
        """Fitted on ``steps`` (those that ran tokens and paid for nothing else: no one-time cost such as
        a compile, no thread probe), then again without the first fit's spikes."""
        steps = [s for s in steps if s.num_scheduled_tokens > 0 and s.is_batch_cost_only]
        if len(steps) < 2:
            raise ValueError(f"{len(steps)} steps ran tokens: too few to fit a step-cost model")
        model = StepCostModel(_non_negative_least_squares(steps))
        calm = [s for s in steps if not model.is_spike(s)]
        return StepCostModel(_non_negative_least_squares(calm)) if len(calm) >= 2 else model

    def predict(self, batch: BatchFeatures) -> float:
        """The step's duration in seconds."""
        return sum(c * x for c, x in zip(self.coefficients, batch.row()))

    def predict_step(self, step: Step) -> float:
        return self.predict(self.features(step))

    def is_spike(self, step: Step) -> bool:
        duration, predicted = step.end - step.start, self.predict_step(step)
        return duration > SPIKE_RATIO * predicted and duration - predicted > SPIKE_MIN_S


def _non_negative_least_squares(steps: Sequence[Step]) -> tuple[float, ...]:
    """The coefficients minimising the squared error over ``steps``, each ≥ 0: the constrained
    optimum is the unconstrained one on the features it leaves non-zero, so it is the best of the
    subsets' unconstrained fits that come out all ≥ 0 (the empty subset, all zeros, always does)."""
    x = np.array([StepCostModel.features(s).row() for s in steps])
    y = np.array([s.end - s.start for s in steps])
    best, best_error = np.zeros(len(FEATURES)), float(y @ y)
    for subset in range(1, 2 ** len(FEATURES)):
        columns = [j for j in range(len(FEATURES)) if subset >> j & 1]
        solution = np.linalg.lstsq(x[:, columns], y, rcond=None)[0]
        if (solution < 0).any():
            continue
        coefficients = np.zeros(len(FEATURES))
        coefficients[columns] = solution
        error = float(np.sum((x @ coefficients - y) ** 2))
        if error < best_error:
            best, best_error = coefficients, error
    return tuple(float(c) for c in best)


@dataclass(frozen=True)
class Spike:
    step: int
    duration_s: float
    predicted_s: float


@dataclass(frozen=True)
class Evaluation:
    """A model fitted on all steps but every ``HOLD_OUT``-th, scored on those it did not see."""

    model: StepCostModel
    num_steps: int  # that ran tokens
    num_fitted: int
    num_held_out: int
    r2: float | None  # on the held-out steps, spikes aside (None: fewer than two, or all equal)
    median_relative_error: float | None  # |predicted - duration| / duration, idem
    spikes: tuple[Spike, ...]  # over every step, in step order

    def as_dict(self) -> dict:
        return {
            "features": [{"name": name, "unit": UNITS[name], "coefficient": c}
                         for name, c in zip(FEATURES, self.model.coefficients)],
            "num_steps": self.num_steps, "num_fitted": self.num_fitted, "num_held_out": self.num_held_out,
            "hold_out_every": HOLD_OUT, "r2": self.r2, "median_relative_error": self.median_relative_error,
            "spikes": [{"step": s.step, "duration_s": s.duration_s, "predicted_s": s.predicted_s} for s in self.spikes],
        }


def evaluate(steps: Sequence[Step]) -> Evaluation:
    """Fit on the steps that ran tokens, every ``HOLD_OUT``-th held out, and score on those."""
    ran = [s for s in steps if s.num_scheduled_tokens > 0]
    held_out = ran[HOLD_OUT - 1::HOLD_OUT]
    fitted = [s for i, s in enumerate(ran, start=1) if i % HOLD_OUT]
    model = StepCostModel.fit(fitted)
    spikes = tuple(Spike(s.number, s.end - s.start, model.predict_step(s)) for s in ran if model.is_spike(s))
    scored = [(s.end - s.start, model.predict_step(s)) for s in held_out if not model.is_spike(s)]
    r2 = median_error = None
    if len(scored) >= 2:
        durations = np.array([d for d, _ in scored])
        residual = float(np.sum((durations - [p for _, p in scored]) ** 2))
        total = float(np.sum((durations - durations.mean()) ** 2))
        r2 = 1 - residual / total if total > 0 else None
        median_error = statistics.median(abs(p - d) / d for d, p in scored if d > 0)
    return Evaluation(model, len(ran), len(fitted), len(held_out), r2, median_error, spikes)


# ---- tracevllm traces fit -----------------------------------------------------------------------

_SHOWN = {"intercept": (1e3, "ms per step"), "prefill_tokens": (1e6, "µs per token"),
          "decode_rows": (1e6, "µs per row"), "context_tokens": (1e9, "ns per token"),
          "requests": (1e6, "µs per request")}
_WORDS = {"intercept": "intercept", "prefill_tokens": "prefill tokens", "decode_rows": "decode rows",
          "context_tokens": "context tokens (summed)", "requests": "requests"}


def describe(e: Evaluation, directory: str) -> str:
    lines = [f"step-cost model of {directory}: {e.num_steps} steps ran tokens, {e.num_fitted} fitted, "
             f"{e.num_held_out} held out (every {HOLD_OUT}th)",
             "  duration = intercept + sum of coefficient x feature, every coefficient >= 0"]
    for name, c in zip(FEATURES, e.model.coefficients):
        scale, unit = _SHOWN[name]
        lines.append(f"  {_WORDS[name]:<26} {c * scale:12.3f} {unit}")
    r2 = "n/a" if e.r2 is None else f"{e.r2:.3f}"
    error = "n/a" if e.median_relative_error is None else f"{100 * e.median_relative_error:.1f} %"
    lines.append(f"held-out steps: R² {r2}, median error {error} (spikes aside)")
    if e.spikes:
        shown = ", ".join(f"step {s.step} ({1e3 * s.duration_s:.1f} ms, predicted {1e3 * s.predicted_s:.1f} ms)"
                          for s in e.spikes[:20])
        more = f", and {len(e.spikes) - 20} more" if len(e.spikes) > 20 else ""
        lines.append(f"spikes (> {SPIKE_RATIO:g}x the prediction and > {1e3 * SPIKE_MIN_S:g} ms over, left out of "
                     f"the fit): {shown}{more}")
    else:
        lines.append("no spikes")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``tracevllm traces fit DIR [--json]`` (ValueError for a trace it cannot fit)."""
    from viz.loader import load_trace

    trace = load_trace(args.directory)
    evaluation = evaluate(trace.require_steps())
    print(json.dumps(evaluation.as_dict(), indent=1) if args.json else describe(evaluation, args.directory))
    return 0
