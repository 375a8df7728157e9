"""The engine step timed at start-up at a ladder of batch shapes: how a what-if prices a batch of a
shape the recorded run never had.

A recorded run's steps are its own configuration's batches: with a budget of 256 tokens every prompt
chunk holds 256, and decode steps run the 10-30 rows that happen to be together. A what-if under
another configuration makes other batches (64-token chunks, the one or two decode rows of a KV cache
that thrashes), and a step's cost is not a line through the recorded ones: on a CPU a 64-token chunk
costs more a token than a 256-token one. So a run that records its steps for a trace also times,
once its model is warm, one dummy prompt chunk of each of ``PREFILL_TOKENS`` and one batch of each
of ``DECODE_ROWS`` dummy one-token requests (the decode path), up to the run's own limits, the fastest
of ``REPEATS`` runs each (``ladder_profile``). The ``Profile steps`` start-up span carries them, and
the step-cost model (``tracevllm/step_cost.py``) reads them as the shape of a step's cost on this
machine (vLLM profiles its forward at start-up too, for memory; Vidur profiles operators at many
sizes, for time). The token budget's start-up times two prompt chunks the same way
(``core/sched/token_budget.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tracevllm.core.stages import PhaseAttr
from tracevllm.step_cost import StepProfile

# Four times apart: between two sizes the cost is close to a line (on the 2-core EPYC, float32, a
# 128-token chunk took 337 ms where the line from 64 to 256 says 341; 8 decode rows 66 ms against 61),
# and beyond the last a chunk costs about as much a token (its GEMMs are efficient from a few hundred
# rows). Each size more costs the start-up its step twice: the whole ladder took 17 s with 1,024-token
# chunks and 256 rows, and takes about 2.5 s so.
PREFILL_TOKENS = (16, 64, 256)
DECODE_ROWS = (1, 4, 16, 64)
REPEATS = 2


def profile_steps(run_dummy_step: Callable[[int, int], int], prefill_tokens: Sequence[int],
                  decode_rows: Sequence[int] = ()) -> StepProfile:
    """Time ``run_dummy_step(tokens, requests)`` (it returns the tokens it really ran) on one prompt
    chunk of each of ``prefill_tokens``, and on one batch of each of ``decode_rows`` one-token
    requests: the fastest of ``REPEATS`` runs each."""
    return StepProfile(_ladder(lambda n: run_dummy_step(n, 1), prefill_tokens),
                       _ladder(lambda n: run_dummy_step(1, n), decode_rows))


def ladder_profile(run_dummy_step: Callable[[int, int], int], max_num_batched_tokens: int,
                   max_num_seqs: int) -> StepProfile:
    """The ladder (``PREFILL_TOKENS``, ``DECODE_ROWS``) within the run's limits: the sizes below each
    limit, and the limit itself when it is not past the ladder."""
    return profile_steps(run_dummy_step, _sizes(PREFILL_TOKENS, max_num_batched_tokens), _sizes(DECODE_ROWS, max_num_seqs))


def profile_attributes(profile: StepProfile) -> dict[str, list[int] | list[float]]:
    """The ``Profile steps`` span's attributes (``viz/fit.py`` reads them back as a ``StepProfile``)."""
    return {PhaseAttr.PROFILE_PREFILL_TOKENS: [n for n, _ in profile.prefill],
            PhaseAttr.PROFILE_PREFILL_SECONDS: [s for _, s in profile.prefill],
            PhaseAttr.PROFILE_DECODE_ROWS: [n for n, _ in profile.decode],
            PhaseAttr.PROFILE_DECODE_SECONDS: [s for _, s in profile.decode]}


def _sizes(ladder: tuple[int, ...], limit: int) -> list[int]:
    """The ladder's sizes below ``limit``, and ``limit`` itself when it is not past the ladder."""
    return [n for n in ladder if n < limit] + ([limit] if limit <= ladder[-1] else [])


def _ladder(run: Callable[[int], int], sizes: Sequence[int]) -> tuple[tuple[int, float], ...]:
    """(size run, fastest seconds), a point per size the limits let run (a size they cut down to one
    already timed adds runs of that one)."""
    points: dict[int, float] = {}
    for size in sizes:
        for _ in range(REPEATS):
            start = time.perf_counter()
            ran = run(size)
            points[ran] = min(points.get(ran, float("inf")), time.perf_counter() - start)
    return tuple(sorted(points.items()))
