"""What an engine step costs, from its batch: a robust linear model fitted on a trace's steps.

``tracevllm traces fit DIR`` fits it and says how well it predicts; ``traces whatif`` uses it as its
clock (``StepCostModel.predict``). A step's duration (its ``engine_step`` span: the four stages) is
modelled as::

    duration = intercept + p * the profiled step
               + a * prefill tokens + b * decode rows + c * context tokens
               + d * prefill attention pairs + e * prefilling requests + f * [the step prefills]

- **the profiled step**: what the start-up's dummy step of the batch's size took (``StepProfile``,
  ``engine/step_profile.py``): a prompt chunk of its tokens when it prefills, else a batch of its
  decode rows. It shows how a step's cost bends with its size (on a CPU a 64-token chunk costs more a
  token than a 256-token one) at sizes the run never had. With it only the terms the ladder does not
  vary are fitted (``WITH_PROFILE``), the others stay at 0; without it, the linear terms below;
- **prefill tokens**: the tokens of the requests that prefill in the step (prompt chunks, and
  recomputation after a preemption);
- **decode rows**: the requests that decode (one token each; each also costs host time: its inputs,
  its sampling, its output);
- **context tokens**: every scheduled request's context, summed: the tokens whose KV it had before
  the step (``step.req_num_computed_tokens``) plus its new ones, all of which its attention reads;
- **prefill attention pairs**: for each prefilling request, its new tokens times its context (each
  new token attends to all of it): a chunk of a long prompt costs more than a first chunk of as many
  tokens, and the gap grows with the prompt;
- **prefilling requests**: the requests that prefill (each one's prompt chunk runs attention on its
  own, one SDPA call per request and layer on CPU, and costs host time as a decode row does);
- **the step prefills**: 1 for a step with a prompt chunk in it, else 0. A step that prefills takes
  the prefill path (its attention, its masks), which costs a fixed time on top of its tokens: on the
  2-core EPYC a step of 8 prompt tokens took 150 ms where a step decoding one row took 83.

It describes one machine and one model: the run it came from. Every coefficient is kept ≥ 0 (a step
cannot get cheaper by doing more), so that a batch bigger than any recorded one is never predicted
to be free.

**Relative and robust.** The fit minimises the steps' errors relative to their durations, so that
the model is as good for the short steps (a few decode rows) as for the long ones (a full prefill):
a run under another configuration may be made of either. And a step that stalled (a garbage
collection, another process on the cores) must not drag the coefficients: the loss is Huber's,
squared for a residual within ``HUBER_K`` robust standard deviations of the residuals (their median
absolute deviation, scaled), linear beyond, so a stall counts as a few ordinary errors, not as a
hundred. A **spike** is a step that took more than ``SPIKE_RATIO`` times its prediction and
``SPIKE_MIN_S`` more; the fit is made again without the first fit's spikes. Steps that paid a one-time
cost (a compile, a first use) or a thread probe are left out before any of this
(``Step.is_batch_cost_only``).

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

from tracevllm.tracing.schema import Attr, SpanName
from viz.model import Step, Trace

# The model's terms, each with the unit of its coefficient (seconds per unit of the feature).
FEATURES = ("intercept", "profiled_step", "prefill_tokens", "decode_rows", "context_tokens", "prefill_attention",
            "prefill_requests", "prefill_step")
# The terms fitted when the trace has a step profile; the others stay at 0 (the profiled step has them).
WITH_PROFILE = ("intercept", "profiled_step", "context_tokens", "prefill_attention", "prefill_requests")
UNITS = {"intercept": "s per step", "profiled_step": "times the profiled step", "prefill_tokens": "s per token",
         "decode_rows": "s per row", "context_tokens": "s per token", "prefill_attention": "s per (new token, context token) pair",
         "prefill_requests": "s per prefilling request",
         "prefill_step": "s per step that prefills"}
SPIKE_RATIO = 3.0
SPIKE_MIN_S = 0.005
HUBER_K = 1.345  # the usual constant: 95 % as efficient as least squares on Gaussian noise
HUBER_ITERATIONS = 30
HOLD_OUT = 5
# Below this held-out R², the model misses more than half of how step durations vary: it predicts a step
# little better than the run's mean step does, so what it says about a batch (and a what-if timed by it) is
# mostly noise. A steady recorded run scores about 0.95 (docs/tracing.md, ``traces fit``), so 0.5 is far
# below a good fit and well above one that found nothing (0, or below: worse than the mean).
MIN_R2 = 0.5


@dataclass(frozen=True, slots=True)
class BatchFeatures:
    """What a step's batch does, as the model reads it."""

    prefill_tokens: int
    decode_rows: int
    context_tokens: int
    prefill_attention: int
    prefill_requests: int
    prefill_step: bool

    @staticmethod
    def of(num_tokens: Sequence[int], is_decode: Sequence[bool], num_computed_tokens: Sequence[int]) -> BatchFeatures:
        """From the batch's requests: each one's new tokens, whether it decodes, and its tokens computed
        before the step."""
        prefills = [(n, c) for n, d, c in zip(num_tokens, is_decode, num_computed_tokens) if not d]
        return BatchFeatures(
            prefill_tokens=sum(n for n, _ in prefills),
            decode_rows=sum(is_decode),
            context_tokens=sum(num_tokens) + sum(num_computed_tokens),
            prefill_attention=sum(n * (c + n) for n, c in prefills),
            prefill_requests=len(prefills),
            prefill_step=bool(prefills),
        )

    def row(self, profile: StepProfile | None) -> list[float]:
        """The model's inputs, in ``FEATURES`` order (1 for the intercept; 0 for the profiled step
        without a profile)."""
        return [1.0, 0.0 if profile is None else profile.seconds(self), self.prefill_tokens, self.decode_rows,
                self.context_tokens, self.prefill_attention, self.prefill_requests, float(self.prefill_step)]


@dataclass(frozen=True, slots=True)
class StepProfile:
    """The step as the start-up timed it (``engine/step_profile.py``): the fastest seconds of one prompt
    chunk of each number of tokens, and of one batch of each number of decode rows, in ascending size."""

    prefill: tuple[tuple[int, float], ...]
    decode: tuple[tuple[int, float], ...]

    @staticmethod
    def recorded(trace: Trace) -> StepProfile | None:
        """The profile in ``trace``'s start-up (its ``Profile steps`` span), or None: a trace recorded
        without its steps, or before start-ups profiled them."""
        span = next((s for s in trace.spans if s.name == SpanName.PROFILE_STEPS), None)
        if span is None:
            return None
        a = span.attributes
        return StepProfile(tuple(zip(a[Attr.PROFILE_PREFILL_TOKENS], a[Attr.PROFILE_PREFILL_SECONDS])),
                           tuple(zip(a[Attr.PROFILE_DECODE_ROWS], a[Attr.PROFILE_DECODE_SECONDS])))

    def seconds(self, batch: BatchFeatures) -> float:
        """What the start-up's step of the batch's size took: a prompt chunk of all its tokens when it
        prefills, else a batch of its decode rows."""
        if batch.prefill_step:
            return _interpolate(self.prefill, batch.prefill_tokens + batch.decode_rows)
        return _interpolate(self.decode, batch.decode_rows)


def _interpolate(points: tuple[tuple[int, float], ...], size: int) -> float:
    """Linear between the two points around ``size``; below the first, the first's seconds (a step
    costs no less for being smaller than the smallest timed); beyond the last, along the last two
    points' slope (or in proportion, with one point)."""
    sizes = [n for n, _ in points]
    seconds = [t for _, t in points]
    if size <= sizes[-1]:
        return float(np.interp(size, sizes, seconds))
    if len(points) == 1:
        return seconds[0] * size / sizes[0]
    slope = max(0.0, (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2]))
    return seconds[-1] + slope * (size - sizes[-1])


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Seconds per unit of each of ``FEATURES``, all ≥ 0, and the step profile the profiled step
    reads (None: that term is 0)."""

    coefficients: tuple[float, ...]
    profile: StepProfile | None = None

    @staticmethod
    def features(step: Step) -> BatchFeatures:
        """The recorded step's batch (ValueError for a trace without each request's computed tokens)."""
        if len(step.req_num_computed_tokens) != len(step.req_ids):
            raise ValueError(f"step {step.number} lacks {Attr.STEP_REQ_NUM_COMPUTED_TOKENS}: the trace was "
                             "recorded before steps carried it (trace format 1); record the run again")
        return BatchFeatures.of(step.req_num_tokens, step.req_is_decode, step.req_num_computed_tokens)

    @staticmethod
    def fit(steps: Sequence[Step], profile: StepProfile | None = None) -> StepCostModel:
        """Fitted on ``steps`` (those that ran tokens and paid for nothing else: no one-time cost such as
        a compile, no thread probe), then again without the first fit's spikes; with ``profile``, on
        the ``WITH_PROFILE`` terms."""
        # (a step that took no measurable time has no relative error: it is left out too)
        steps = [s for s in steps if s.num_scheduled_tokens > 0 and s.is_batch_cost_only and s.end > s.start]
        if len(steps) < 2:
            raise ValueError(f"{len(steps)} steps ran tokens: too few to fit a step-cost model")
        model = StepCostModel(_robust_non_negative_fit(steps, profile), profile)
        calm = [s for s in steps if not model.is_spike(s)]
        return StepCostModel(_robust_non_negative_fit(calm, profile), profile) if len(calm) >= 2 else model

    @staticmethod
    def fit_trace(trace: Trace) -> StepCostModel:
        """Fitted on ``trace``'s steps, with its step profile when it has one."""
        return StepCostModel.fit(trace.require_steps(), StepProfile.recorded(trace))

    def predict(self, batch: BatchFeatures) -> float:
        """The step's duration in seconds."""
        return sum(c * x for c, x in zip(self.coefficients, batch.row(self.profile)))

    def predict_step(self, step: Step) -> float:
        return self.predict(self.features(step))

    def is_spike(self, step: Step) -> bool:
        duration, predicted = step.end - step.start, self.predict_step(step)
        return duration > SPIKE_RATIO * predicted and duration - predicted > SPIKE_MIN_S


def _robust_non_negative_fit(steps: Sequence[Step], profile: StepProfile | None) -> tuple[float, ...]:
    """The coefficients, each ≥ 0 (and 0 for a term the fit leaves out: with ``profile``, those not in
    ``WITH_PROFILE``; without, the profiled step), that minimise the Huber loss of the steps' relative residuals
    ((predicted - duration) / duration), by iteratively reweighted least squares: a step whose
    residual is within the threshold weighs 1, one beyond it weighs threshold / |residual| (its pull
    stops growing), and the weighted fit is made again until the weights settle. The threshold is
    ``HUBER_K`` robust standard deviations (the median absolute deviation, scaled) of the plain fit's
    residuals."""
    durations = np.array([s.end - s.start for s in steps])
    # Each row over its step's duration: the residuals are relative, so a 75 ms decode step counts as
    # much as a 700 ms prefill (a run of another configuration may be made of either).
    x = np.array([StepCostModel.features(s).row(profile) for s in steps]) / durations[:, None]
    x[:, [name not in WITH_PROFILE if profile else name == "profiled_step" for name in FEATURES]] = 0.0
    y = np.ones(len(steps))
    coefficients = _non_negative_least_squares(x, y)
    residuals = y - x @ coefficients
    threshold = HUBER_K * 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
    for _ in range(HUBER_ITERATIONS if threshold > 0 else 0):
        weights = np.minimum(1.0, threshold / np.maximum(np.abs(residuals), 1e-12))
        root = np.sqrt(weights)
        previous, coefficients = coefficients, _non_negative_least_squares(x * root[:, None], y * root)
        residuals = y - x @ coefficients
        if np.allclose(coefficients, previous, rtol=1e-6, atol=1e-15):
            break
    return tuple(float(c) for c in coefficients)


def _non_negative_least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The coefficients minimising ``|x c - y|²``, each ≥ 0, by Lawson and Hanson's active-set method:
    start with every coefficient at 0; free the one whose increase would cut the error most, solve
    least squares on the free ones, and where that drives one below 0 step back to the boundary and
    fix it at 0 again; stop when no fixed coefficient would cut the error by growing. Columns are
    scaled to unit length first (the features span 1 to millions)."""
    norms = np.linalg.norm(x, axis=0)
    norms[norms == 0] = 1.0
    a = x / norms
    free = np.zeros(a.shape[1], dtype=bool)
    c = np.zeros(a.shape[1])
    tolerance = 1e-10 * max(1.0, float(np.abs(a.T @ y).max()))
    for _ in range(3 * a.shape[1]):
        gradient = a.T @ (y - a @ c)  # how fast the error falls as each coefficient grows
        if free.all() or gradient[~free].max() <= tolerance:
            break
        free[np.argmax(np.where(free, -np.inf, gradient))] = True
        while True:
            trial = np.zeros_like(c)
            trial[free] = np.linalg.lstsq(a[:, free], y, rcond=None)[0]
            if not free.any() or trial[free].min() > 0:  # (rounding can send the one just freed back)
                break
            crossing = free & (trial <= 0)
            step = float(np.min(c[crossing] / (c[crossing] - trial[crossing])))
            c = c + step * (trial - c)
            free &= c > 1e-15
        c = trial
    return c / norms


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
    """Fit on the steps that ran tokens (with ``profile``, as ``StepCostModel.fit``), every
    ``HOLD_OUT``-th held out, and score on those."""
    ran = [s for s in steps if s.num_scheduled_tokens > 0]
    held_out = ran[HOLD_OUT - 1::HOLD_OUT]
    fitted = [s for i, s in enumerate(ran, start=1) if i % HOLD_OUT]
    model = StepCostModel.fit(fitted, profile)
    batch_only = [s for s in ran if s.is_batch_cost_only]
    spikes = tuple(Spike(s.number, s.end - s.start, model.predict_step(s)) for s in batch_only if model.is_spike(s))
    scored = [(s.end - s.start, model.predict_step(s)) for s in held_out
              if s.is_batch_cost_only and not model.is_spike(s)]
    r2 = median_error = None
    if len(scored) >= 2:
        durations = np.array([d for d, _ in scored])
        residual = float(np.sum((durations - [p for _, p in scored]) ** 2))
        total = float(np.sum((durations - durations.mean()) ** 2))
        r2 = 1 - residual / total if total > 0 else None
        median_error = statistics.median(abs(p - d) / d for d, p in scored if d > 0)
    calm = [(s.end - s.start, model.predict_step(s)) for s in fitted if s.is_batch_cost_only and not model.is_spike(s)]
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
                     f"({len(profile.prefill)} sizes), decode batches of {d0}-{d1} rows ({len(profile.decode)} sizes)")
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
    evaluation = evaluate(trace.require_steps(), StepProfile.recorded(trace))
    print(json.dumps(evaluation.as_dict(), indent=1) if args.json else describe(evaluation, args.directory))
    return 0
