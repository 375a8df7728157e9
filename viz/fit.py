"""``tracevllm traces fit DIR``: the step-cost model (``tracevllm/step_cost.py``) fitted on a trace's
steps, and how well it predicts them.

A step's batch is read off its ``engine_step`` span (``step_features``), its duration is the span's
(the four stages), and the step profile off the ``Profile steps`` start-up span when the run timed one
(``recorded_profile``). Steps that ran no tokens, took no measurable time, or paid a one-time cost (a
compile, a first use) or a thread probe are left out of the fit (``Step.is_batch_cost_only``).
``fit_trace`` is the model ``traces whatif`` and ``traces explain`` use.

``evaluate`` holds every ``HOLD_OUT``-th step out of the fit (steps 5, 10, 15, ... of those that ran
tokens) and scores the model on them: R² and the median relative error, spikes aside (they are listed
on their own); and it gives the residuals of the fitted steps. An R² below ``MIN_R2`` is a warning: the
model explains little, and the run should be recorded again, longer and on a quieter machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracevllm.step_cost import (FEATURES, PROFILE_PRIOR_SD, SPIKE_MIN_S, SPIKE_RATIO, UNITS, WITH_PROFILE, BatchFeatures,
                                 StepCostModel, StepProfile)
from tracevllm.tracing.schema import Attr, SpanName
from viz.model import Step, Trace

HOLD_OUT = 5
# Below this held-out R², the model misses more than half of how step durations vary: it predicts a step
# little better than the run's mean step does, so what it says about a batch (and a what-if timed by it) is
# mostly noise. A steady recorded run scores about 0.95 (docs/tracing.md, ``traces fit``), so 0.5 is far
# below a good fit and well above one that found nothing (0, or below: worse than the mean).
MIN_R2 = 0.5


def step_features(step: Step) -> BatchFeatures:
    """The recorded step's batch (ValueError for a trace without each request's computed tokens)."""
    if len(step.req_num_computed_tokens) != len(step.req_ids):
        raise ValueError(f"step {step.number} lacks {Attr.STEP_REQ_NUM_COMPUTED_TOKENS}: the trace was "
                         "recorded before steps carried it (trace format 1); record the run again")
    return BatchFeatures.of(step.req_num_tokens, step.req_is_decode, step.req_num_computed_tokens)


def recorded_profile(trace: Trace) -> StepProfile | None:
    """The profile in ``trace``'s start-up (its ``Profile steps`` span), or None: a trace recorded
    without its steps, or before start-ups profiled them."""
    span = next((s for s in trace.spans if s.name == SpanName.PROFILE_STEPS), None)
    if span is None:
        return None
    a = span.attributes
    return StepProfile(tuple(zip(a[Attr.PROFILE_PREFILL_TOKENS], a[Attr.PROFILE_PREFILL_SECONDS])),
                       tuple(zip(a[Attr.PROFILE_DECODE_ROWS], a[Attr.PROFILE_DECODE_SECONDS])))


def fit_steps(steps: Sequence[Step], profile: StepProfile | None = None) -> StepCostModel:
    """Fitted on ``steps`` that ran tokens and paid for nothing else (ValueError: fewer than two)."""
    # (a step that took no measurable time has no relative error: it is left out too)
    steps = [s for s in steps if s.num_scheduled_tokens > 0 and s.is_batch_cost_only and s.end > s.start]
    return StepCostModel.fit([step_features(s) for s in steps], [s.end - s.start for s in steps], profile)


def fit_trace(trace: Trace) -> StepCostModel:
    """Fitted on ``trace``'s steps, with its step profile when it has one."""
    return fit_steps(trace.require_steps(), recorded_profile(trace))


def predict_step(model: StepCostModel, step: Step) -> float:
    return model.predict(step_features(step))


def is_spike(model: StepCostModel, step: Step) -> bool:
    return model.is_spike(step_features(step), step.end - step.start)


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
    num_paid_other: int  # steps left out: they paid a one-time cost or a thread probe
    residuals_s: tuple[float, float]  # |predicted - duration| over the fitted steps, spikes aside: median, p90
    relative_residuals: tuple[float, float]  # the same over each step's duration

    @property
    def warning(self) -> str | None:
        """What to do when the model explains little of the held-out steps (R² below ``MIN_R2``), else None."""
        if self.r2 is None or self.r2 >= MIN_R2:
            return None
        return (f"this model explains little: R² {self.r2:.3f} on the held-out steps (below {MIN_R2}), so its "
                "predictions, and a what-if timed by it, are not to be trusted. Record a longer run, with more "
                "varied steps (prompts of several lengths, several requests at once), on a quieter machine "
                "(nothing else busy on its cores)")

    def as_dict(self) -> dict:
        return {
            "features": [{"name": name, "unit": UNITS[name], "coefficient": c}
                         for name, c in zip(FEATURES, self.model.coefficients)],
            "profile": None if self.model.profile is None else {
                "prefill": [list(p) for p in self.model.profile.prefill],
                "decode": [list(p) for p in self.model.profile.decode]},
            "num_steps": self.num_steps, "num_fitted": self.num_fitted, "num_held_out": self.num_held_out,
            "hold_out_every": HOLD_OUT, "r2": self.r2, "median_relative_error": self.median_relative_error,
            "spikes": [{"step": s.step, "duration_s": s.duration_s, "predicted_s": s.predicted_s} for s in self.spikes],
            "num_paid_other": self.num_paid_other,
            "residuals_s": {"median": self.residuals_s[0], "p90": self.residuals_s[1]},
            "relative_residuals": {"median": self.relative_residuals[0], "p90": self.relative_residuals[1]},
            "warning": self.warning,
        }


def evaluate(steps: Sequence[Step], profile: StepProfile | None = None) -> Evaluation:
    """Fit on the steps that ran tokens (with ``profile``, as ``fit_steps``), every
    ``HOLD_OUT``-th held out, and score on those."""
    ran = [s for s in steps if s.num_scheduled_tokens > 0]
    held_out = ran[HOLD_OUT - 1::HOLD_OUT]
    fitted = [s for i, s in enumerate(ran, start=1) if i % HOLD_OUT]
    model = fit_steps(fitted, profile)
    batch_only = [s for s in ran if s.is_batch_cost_only]
    spikes = tuple(Spike(s.number, s.end - s.start, predict_step(model, s)) for s in batch_only if is_spike(model, s))
    scored = [(s.end - s.start, predict_step(model, s)) for s in held_out
              if s.is_batch_cost_only and not is_spike(model, s)]
    r2 = median_error = None
    if len(scored) >= 2:
        durations = np.array([d for d, _ in scored])
        residual = float(np.sum((durations - [p for _, p in scored]) ** 2))
        total = float(np.sum((durations - durations.mean()) ** 2))
        r2 = 1 - residual / total if total > 0 else None
        median_error = statistics.median(abs(p - d) / d for d, p in scored if d > 0)
    calm = [(s.end - s.start, predict_step(model, s)) for s in fitted if s.is_batch_cost_only and not is_spike(model, s)]
    absolute = sorted(abs(p - d) for d, p in calm)
    relative = sorted(abs(p - d) / d for d, p in calm if d > 0)
    return Evaluation(model, len(ran), len(fitted), len(held_out), r2, median_error, spikes,
                      len(ran) - len(batch_only), _median_p90(absolute), _median_p90(relative))


def _median_p90(ordered: list[float]) -> tuple[float, float]:
    if not ordered:
        return float("nan"), float("nan")
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


# ---- tracevllm traces fit -----------------------------------------------------------------------

_SHOWN = {"intercept": (1e3, "ms per step"), "profiled_step": (1.0, "x"), "prefill_tokens": (1e6, "µs per token"),
          "decode_rows": (1e6, "µs per row"), "context_tokens": (1e9, "ns per token"),
          "prefill_attention": (1e9, "ns per pair"), "prefill_requests": (1e6, "µs per request"),
          "prefill_step": (1e3, "ms per step")}
_WORDS = {"intercept": "intercept", "profiled_step": "the profiled step", "prefill_tokens": "prefill tokens", "decode_rows": "decode rows",
          "context_tokens": "context tokens (summed)", "prefill_attention": "prefill attention pairs",
          "prefill_requests": "prefilling requests", "prefill_step": "the step prefills"}


def describe(e: Evaluation, directory: str) -> str:
    lines = [f"step-cost model of {directory}: {e.num_steps} steps ran tokens, {e.num_fitted} fitted, "
             f"{e.num_held_out} held out (every {HOLD_OUT}th)",
             "  duration = intercept + sum of coefficient x feature, every coefficient >= 0 "
             "(Huber loss on relative errors)"]
    profile = e.model.profile
    if profile is None:
        lines.append("  no step profile in the trace (its start-up did not time the ladder): the linear terms")
    else:
        (p0, _), (p1, _), (d0, _), (d1, _) = profile.prefill[0], profile.prefill[-1], profile.decode[0], profile.decode[-1]
        lines.append(f"  with the start-up's step profile: prompt chunks of {p0}-{p1} tokens "
                     f"({len(profile.prefill)} sizes), decode batches of {d0}-{d1} rows ({len(profile.decode)} sizes); "
                     f"its scale drawn toward 1 (a prior of 1 ± {PROFILE_PRIOR_SD:g})")
    for name, c in zip(FEATURES, e.model.coefficients):
        if (name not in WITH_PROFILE) if profile else name == "profiled_step":
            continue
        scale, unit = _SHOWN[name]
        lines.append(f"  {_WORDS[name]:<26} {c * scale:12.3f} {unit}")
    r2 = "n/a" if e.r2 is None else f"{e.r2:.3f}"
    error = "n/a" if e.median_relative_error is None else f"{100 * e.median_relative_error:.1f} %"
    lines.append(f"held-out steps: R² {r2}, median error {error} (spikes aside)")
    if e.warning is not None:
        lines.append(f"warning: {e.warning}.")
    (median, p90), (relative_median, relative_p90) = e.residuals_s, e.relative_residuals
    lines.append(f"fitted steps' residuals |predicted - duration|: median {1e3 * median:.2f} ms "
                 f"({100 * relative_median:.1f} %), p90 {1e3 * p90:.2f} ms ({100 * relative_p90:.1f} %)")
    if e.num_paid_other:
        lines.append(f"{e.num_paid_other} steps left out: they paid a one-time cost or a thread probe")
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
    from viz.trace_loader import load_trace

    trace = load_trace(args.directory)
    evaluation = evaluate(trace.require_steps(), recorded_profile(trace))
    print(json.dumps(evaluation.as_dict(), indent=1) if args.json else describe(evaluation, args.directory))
    return 0
