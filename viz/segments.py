"""A request's life cut into queued / prefill / decode / preempted segments.

The ``SCHEDULED`` and ``PREEMPTED`` events alternate: waiting until an admission, running until a
preemption (or the end), waiting again until the next admission::

    QUEUED ..queued.. SCHEDULED ..running.. PREEMPTED ..preempted.. SCHEDULED ..running.. FINISHED

A running stretch is prefill up to the end of its last prefill chunk (a prompt chunk, or the
recomputation after a preemption) and decode after that. Without engine steps
(``--trace-level request``) there are no chunks: the first stretch turns from prefill to decode at the
first token, and a stretch after a preemption counts as decode, as the ``decode`` span counts it.
"""

from __future__ import annotations

from collections.abc import Sequence

from viz.model import Chunk, Segment, SegmentKind


def _running(start: float, end: float, chunks: Sequence[Chunk], first_token: float | None,
             first_stretch: bool) -> list[Segment]:
    if chunks:
        prefill_ends = [c.end for c in chunks if not c.is_decode and c.end > start and c.start < end]
        split = min(max(prefill_ends), end) if prefill_ends else start
    elif first_stretch:
        split = end if first_token is None else min(max(first_token, start), end)
    else:
        split = start
    return [Segment(kind, a, b) for kind, a, b in (("prefill", start, split), ("decode", split, end)) if b > a]


def request_segments(queued: float, admissions: Sequence[float], preemptions: Sequence[float],
                     finished: float, first_token: float | None, chunks: Sequence[Chunk]) -> tuple[Segment, ...]:
    """The segments from ``queued`` to ``finished``, in time order."""
    marks = sorted([(t, "admitted") for t in admissions] + [(t, "preempted") for t in preemptions])
    segments: list[Segment] = []
    waiting: SegmentKind = "queued"
    since, running = queued, False
    for time, mark in marks:
        if mark == "admitted" and not running:
            segments.append(Segment(waiting, since, time))
            running = True
        elif mark == "preempted" and running:
            segments += _running(since, time, chunks, first_token, first_stretch=waiting == "queued")
            waiting, running = "preempted", False
        since = time
    if running:
        segments += _running(since, finished, chunks, first_token, first_stretch=waiting == "queued")
    elif finished > since:  # aborted while waiting
        segments.append(Segment(waiting, since, finished))
    return tuple(segments)
