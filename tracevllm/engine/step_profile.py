"""The engine step timed at start-up at a ladder of batch shapes: how a what-if prices a batch of a
shape the recorded run never had.

A recorded run's steps are its own configuration's batches: with a budget of 256 tokens every prompt
chunk holds 256, and decode steps run the 10-30 rows that happen to be together. A what-if under
another configuration makes other batches (64-token chunks, the one or two decode rows of a KV cache
that thrashes), and a step's cost is not a line through the recorded ones: on a CPU a 64-token chunk
costs more a token than a 256-token one. So a run that records its steps for a trace also times,
once its model is warm, one dummy prompt chunk of each of ``PREFILL_TOKENS`` and one batch of each
of ``DECODE_ROWS`` dummy one-token requests (the decode path), up to the run's own limits, the fastest
of ``REPEATS`` runs each. The ``Profile steps`` start-up span carries them, and ``viz/step_cost.py``
reads them as the shape of a step's cost on this machine (vLLM profiles its forward at start-up too,
for memory; Vidur profiles operators at many sizes, for time).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tracevllm.core.stages import PhaseAttr

# Four times apart: between two sizes the cost is close to a line (on the 2-core EPYC, float32, a
# 128-token chunk took 337 ms where the line from 64 to 256 says 341; 8 decode rows 66 ms against 61),
# and beyond the last a chunk costs about as much a token (its GEMMs are efficient from a few hundred
# rows). Each size more costs the start-up its step twice: the whole ladder took 17 s with 1,024-token
# chunks and 256 rows, and takes about 2.5 s so.
PREFILL_TOKENS = (16, 64, 256)
DECODE_ROWS = (1, 4, 16, 64)
REPEATS = 2


def profile_steps(run_dummy_step: Callable[[int, int], int], max_num_batched_tokens: int,
                  max_num_seqs: int) -> dict[str, list[int] | list[float]]:
    """Time ``run_dummy_step(tokens, requests)`` (it returns the tokens it really ran) on one prompt
    chunk of each of ``PREFILL_TOKENS`` below the budget, and of the budget when it is below the
    last; likewise batches of one-token requests up to ``max_num_seqs``: the ``Profile steps``
    attributes."""
    prefill = _ladder(lambda n: run_dummy_step(n, 1), _sizes(PREFILL_TOKENS, max_num_batched_tokens))
    decode = _ladder(lambda n: run_dummy_step(1, n), _sizes(DECODE_ROWS, max_num_seqs))
    return {PhaseAttr.PROFILE_PREFILL_TOKENS: [n for n, _ in prefill],
            PhaseAttr.PROFILE_PREFILL_SECONDS: [s for _, s in prefill],
            PhaseAttr.PROFILE_DECODE_ROWS: [n for n, _ in decode],
            PhaseAttr.PROFILE_DECODE_SECONDS: [s for _, s in decode]}


def _sizes(ladder: tuple[int, ...], limit: int) -> list[int]:
    """The ladder's sizes below ``limit``, and ``limit`` itself when it is not past the ladder."""
    return [n for n in ladder if n < limit] + ([limit] if limit <= ladder[-1] else [])


def _ladder(run: Callable[[int], int], sizes: list[int]) -> list[tuple[int, float]]:
    """(size run, fastest seconds), a point per size the limits let run (a size they cut down to one
    already timed adds runs of that one)."""
    points: dict[int, float] = {}
    for size in sizes:
        for _ in range(REPEATS):
            start = time.perf_counter()
            ran = run(size)
            points[ran] = min(points.get(ran, float("inf")), time.perf_counter() - start)
    return sorted(points.items())
