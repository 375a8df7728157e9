"""The server's token budget on CPU, fitted to a step measured at start-up.

Every stream waits for each engine step, so the longest a step takes is the longest gap a client sees
between two chunks. A step's cost grows with the tokens it runs, ``max_num_batched_tokens`` at most,
and a CPU runs far fewer tokens a second than a GPU: vLLM's fixed CPU default (2048 for the server)
made steps of several seconds on a 2-core machine. So when the user sets no budget, the engine core
times two dummy prefill steps once the model is warm, fits ``seconds = fixed + per_token x tokens``
through them, and lowers the budget to the tokens that fit in ``target_step_seconds``.

The budget never drops below ``max_num_seqs`` (each running request must be able to decode every
step) nor rises above the default it started from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# The two dummy prompts timed, in tokens: small enough to cost little, far enough apart to fit a slope.
PROBE_TOKENS = (32, 256)
# Each probe runs this many times; the fastest run counts (the others met a noisy neighbour).
PROBE_REPEATS = 2


@dataclass(frozen=True)
class StepCost:
    """A step's cost as measured here: ``fixed_s + per_token_s x tokens`` seconds."""

    fixed_s: float
    per_token_s: float

    def seconds(self, num_tokens: int) -> float:
        return self.fixed_s + self.per_token_s * num_tokens


def measure_step_cost(run_dummy_step: Callable[[int], int]) -> StepCost:
    """Time ``run_dummy_step(tokens)`` (which returns the tokens it really ran) at each of
    ``PROBE_TOKENS`` and fit a line through the fastest run of each."""
    points = []
    for tokens in PROBE_TOKENS:
        best, ran = float("inf"), tokens
        for _ in range(PROBE_REPEATS):
            start = time.perf_counter()
            ran = run_dummy_step(tokens)
            best = min(best, time.perf_counter() - start)
        points.append((ran, best))
    (t1, s1), (t2, s2) = points
    per_token = (s2 - s1) / (t2 - t1) if t2 > t1 else s2 / max(t2, 1)
    per_token = max(per_token, 1e-9)  # noise can make the larger probe look no slower
    return StepCost(fixed_s=max(s1 - per_token * t1, 0.0), per_token_s=per_token)


def fit_token_budget(cost: StepCost, target_step_seconds: float, max_num_seqs: int, ceiling: int) -> int:
    """The most tokens a step may hold so that it takes ``target_step_seconds`` at ``cost``, in
    multiples of 16, within [``max_num_seqs``, ``ceiling``]."""
    fits = int((target_step_seconds - cost.fixed_s) / cost.per_token_s) // 16 * 16
    return max(max_num_seqs, min(ceiling, fits))
