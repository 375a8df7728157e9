"""What an engine step costs, from its batch: the one step-cost model.

Four readers use it: the start-up's token budget (``core/sched/token_budget.py``: the most tokens a
step may hold), ``traces fit`` (the model fitted on a trace's steps, ``viz/fit.py``), ``traces
whatif`` (its clock, ``whatif/pace.py``) and ``traces explain`` (each request's share of a step, and
the steps far slower than their batch, ``viz/explain.py``). A step's duration is modelled as::

    duration = intercept + p * the profiled step
               + a * prefill tokens + b * decode rows + c * context tokens
               + d * prefill attention pairs + e * prefilling requests + f * [the step prefills]

- **the profiled step**: what the start-up's dummy step of the batch's size took (``StepProfile``,
  ``engine/step_profile.py``): a prompt chunk of its tokens when it prefills, else a batch of its
  decode rows. It shows how a step's cost bends with its size (on a CPU a 64-token chunk costs more a
  token than a 256-token one) at sizes the run never had. With it only the terms the ladder does not
  vary are fitted (``WITH_PROFILE``), the others stay at 0; without it, the linear terms below. The
  token budget uses it alone (``from_profile``);
- **prefill tokens**: the tokens of the requests that prefill in the step (prompt chunks, and
  recomputation after a preemption);
- **decode rows**: the requests that decode (one token each; each also costs host time);
- **context tokens**: every scheduled request's context, summed: the tokens whose KV it had before
  the step plus its new ones, all of which its attention reads;
- **prefill attention pairs**: for each prefilling request, its new tokens times its context: a chunk
  of a long prompt costs more than a first chunk of as many tokens;
- **prefilling requests**: each one's prompt chunk runs attention on its own and costs host time;
- **the step prefills**: a step with a prompt chunk takes the prefill path, a fixed time on top of its
  tokens (on the 2-core EPYC a step of 8 prompt tokens took 150 ms where one decode row took 83).

It describes one machine and one model. Every coefficient is kept ≥ 0 (a step cannot get cheaper by
doing more), so that a batch bigger than any seen is never predicted to be free.

**Relative and robust.** ``fit`` minimises the steps' errors relative to their durations, so that the
model is as good for short steps as for long ones, with Huber's loss: squared within ``HUBER_K``
robust standard deviations of the residuals, linear beyond, so a step that stalled counts as a few
ordinary errors, not as a hundred. A **spike** took more than ``SPIKE_RATIO`` times its prediction and
``SPIKE_MIN_S`` more; the fit is made again without the first fit's spikes.

**The profile's prior.** With a step profile, the profiled step's coefficient is drawn toward 1 (the
start-up's own step, as timed) with a Gaussian prior of standard deviation ``PROFILE_PRIOR_SD``: the
fit minimises the steps' loss plus ``(σ / PROFILE_PRIOR_SD)² (p - 1)²``, σ being the residuals' robust
standard deviation, which is what a Gaussian prior adds to Gaussian errors (the maximum a posteriori
fit). Why: a run whose batches span a narrow range cannot tell the intercept from the profiled step's
scale, both growing alike over those few sizes. 30 served runs of one workload on one machine (1-10
requests a step) fitted anywhere from 1 ms + 1.02 of the profile to 57 ms + 0.00 of it; the larger
batches of another configuration were then priced by a slope shrunk by that arbitrary scale
(docs/whatif.md, "The profile's scale drawn toward 1"). A run that does span sizes moves the
coefficient as far as its steps show.

Only numpy: the engine's start-up and ``viz`` (which reads traces without the engine) both import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The model's terms, each with the unit of its coefficient (seconds per unit of the feature).
FEATURES = ("intercept", "profiled_step", "prefill_tokens", "decode_rows", "context_tokens", "prefill_attention",
            "prefill_requests", "prefill_step")
# The terms fitted when there is a step profile; the others stay at 0 (the profiled step has them).
WITH_PROFILE = ("intercept", "profiled_step", "context_tokens", "prefill_attention", "prefill_requests")
UNITS = {"intercept": "s per step", "profiled_step": "times the profiled step", "prefill_tokens": "s per token",
         "decode_rows": "s per row", "context_tokens": "s per token",
         "prefill_attention": "s per (new token, context token) pair", "prefill_requests": "s per prefilling request",
         "prefill_step": "s per step that prefills"}
SPIKE_RATIO = 3.0
SPIKE_MIN_S = 0.005
HUBER_K = 1.345  # the usual constant: 95 % as efficient as least squares on Gaussian noise
HUBER_ITERATIONS = 30
PROFILE_PRIOR_SD = 0.1  # the profiled step's coefficient, before the run's steps: 1 ± 0.1 (a start-up's own step)


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

    @staticmethod
    def prompt_chunk(num_tokens: int) -> BatchFeatures:
        """One request's first ``num_tokens`` prompt tokens: the step the token budget is sized by."""
        return BatchFeatures.of([num_tokens], [False], [0])

    def row(self, profile: StepProfile | None) -> list[float]:
        """The model's inputs, in ``FEATURES`` order (1 for the intercept; 0 for the profiled step
        without a profile)."""
        return [1.0, 0.0 if profile is None else profile.seconds(self), self.prefill_tokens, self.decode_rows,
                self.context_tokens, self.prefill_attention, self.prefill_requests, float(self.prefill_step)]


@dataclass(frozen=True, slots=True)
class StepProfile:
    """The step as the start-up timed it (``engine/step_profile.py``): the fastest seconds of one prompt
    chunk of each number of tokens, and of one batch of each number of decode rows, in ascending size
    (either may be empty when the start-up timed only the other)."""

    prefill: tuple[tuple[int, float], ...]
    decode: tuple[tuple[int, float], ...] = ()

    def seconds(self, batch: BatchFeatures) -> float:
        """What the start-up's step of the batch's size took: a prompt chunk of all its tokens when it
        prefills (or when no decode batch was timed), else a batch of its decode rows."""
        if batch.prefill_step or not self.decode:
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
    def from_profile(profile: StepProfile) -> StepCostModel:
        """The profiled step alone: what the start-up timed, before any request ran."""
        return StepCostModel(tuple(float(name == "profiled_step") for name in FEATURES), profile)

    @staticmethod
    def fit(batches: Sequence[BatchFeatures], durations: Sequence[float],
            profile: StepProfile | None = None) -> StepCostModel:
        """Fitted on steps that ran these batches in these durations (seconds, each > 0), then again
        without the first fit's spikes; with ``profile``, on the ``WITH_PROFILE`` terms."""
        if len(batches) < 2:
            raise ValueError(f"{len(batches)} steps ran tokens: too few to fit a step-cost model")
        model = StepCostModel(_robust_non_negative_fit(batches, durations, profile), profile)
        calm = [i for i, (b, d) in enumerate(zip(batches, durations)) if not model.is_spike(b, d)]
        if len(calm) < 2:
            return model
        return StepCostModel(_robust_non_negative_fit([batches[i] for i in calm], [durations[i] for i in calm],
                                                      profile), profile)

    def predict(self, batch: BatchFeatures) -> float:
        """The step's duration in seconds."""
        return sum(c * x for c, x in zip(self.coefficients, batch.row(self.profile)))

    def is_spike(self, batch: BatchFeatures, duration: float) -> bool:
        """Whether a step of ``batch`` that took ``duration`` seconds took far longer than its batch explains."""
        predicted = self.predict(batch)
        return duration > SPIKE_RATIO * predicted and duration - predicted > SPIKE_MIN_S

    def shares(self, num_tokens: Sequence[int], is_decode: Sequence[bool],
               num_computed_tokens: Sequence[int]) -> list[float]:
        """Each request's fraction of its step's cost, adding up to 1: every term charged to the
        requests that cause it (the intercept equally, the profiled step by new tokens, the step's
        prefill path equally among its prefilling requests, the rest by each request's own part); none
        for a step that ran no request."""
        if not num_tokens:
            return []
        batch = BatchFeatures.of(num_tokens, is_decode, num_computed_tokens)
        profiled = 0.0 if self.profile is None else self.profile.seconds(batch)
        total_tokens = max(sum(num_tokens), 1)
        weights = []
        for n, d, c in zip(num_tokens, is_decode, num_computed_tokens):
            own = BatchFeatures.of([n], [d], [c])
            row = [1 / len(num_tokens), profiled * n / total_tokens, own.prefill_tokens, own.decode_rows,
                   own.context_tokens, own.prefill_attention, own.prefill_requests,
                   own.prefill_step / max(batch.prefill_requests, 1)]
            weights.append(sum(k * x for k, x in zip(self.coefficients, row)))
        total = sum(weights)
        if total <= 0:
            return [1 / len(weights)] * len(weights)
        return [w / total for w in weights]


def _robust_non_negative_fit(batches: Sequence[BatchFeatures], durations: Sequence[float],
                             profile: StepProfile | None) -> tuple[float, ...]:
    """The coefficients, each ≥ 0 (and 0 for a term the fit leaves out: with ``profile``, those not in
    ``WITH_PROFILE``; without, the profiled step), that minimise the Huber loss of the steps' relative
    residuals ((predicted - duration) / duration), plus, with ``profile``, the profile's prior (the
    module's docstring). By iteratively reweighted least squares: a step whose residual is within the
    threshold weighs 1, one beyond it weighs threshold / |residual| (its pull stops growing), and the
    weighted fit is made again until the weights settle. The threshold is ``HUBER_K`` robust standard
    deviations σ (the median absolute deviation, scaled) of the plain fit's residuals."""
    # Each row over its step's duration: the residuals are relative, so a 75 ms decode step counts as
    # much as a 700 ms prefill (a run of another configuration may be made of either).
    x = np.array([b.row(profile) for b in batches]) / np.asarray(durations, dtype=float)[:, None]
    x[:, [name not in WITH_PROFILE if profile else name == "profiled_step" for name in FEATURES]] = 0.0
    y = np.ones(len(batches))
    residuals = y - x @ _non_negative_least_squares(x, y)
    sigma = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
    # The prior is one more row: sqrt(λ) (p - 1) is a residual like the steps', λ = (σ / sd)².
    prior_x, prior_y = np.zeros((0, len(FEATURES))), np.zeros(0)
    if profile is not None and sigma > 0:
        root_lambda = sigma / PROFILE_PRIOR_SD
        prior_x = root_lambda * np.eye(len(FEATURES))[[FEATURES.index("profiled_step")]]
        prior_y = np.array([root_lambda])

    def weighted_fit(weights: np.ndarray) -> np.ndarray:
        root = np.sqrt(weights)
        return _non_negative_least_squares(np.vstack([x * root[:, None], prior_x]), np.concatenate([y * root, prior_y]))

    coefficients = weighted_fit(np.ones(len(batches)))
    residuals = y - x @ coefficients
    threshold = HUBER_K * sigma
    for _ in range(HUBER_ITERATIONS if threshold > 0 else 0):
        previous = coefficients
        coefficients = weighted_fit(np.minimum(1.0, threshold / np.maximum(np.abs(residuals), 1e-12)))
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
