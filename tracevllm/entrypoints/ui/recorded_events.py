"""The engine's events, told again from a trace: ``trace_events(trace)`` rebuilds, from a step-level
``--trace-out`` directory, the typed events of ``tracevllm/core/events.py`` that the engine core
recorded while the run went on, each with its time. ``tracevllm traces view`` replays them to the
live page (``tracevllm/entrypoints/ui/``) as if the engine were running now.

Where each comes from (the names of ``tracevllm.tracing.schema``)::

    StepStarted, StepRecord    each engine_step span: the batch, the gauges after the step, and the
                               durations of its stage spans
    RequestQueued              a scheduler.request's QUEUED (trace_headers: a traceparent naming the
                               request's trace and its llm_request)
    RequestWaiting, -Scheduled, -Resumed, -Preempted, -Finished
                               the scheduler.request's WAITING, SCHEDULED, RESUMED, PREEMPTED, FINISHED
    BlocksAllocated, PrefixCacheHit, BlocksFreed, BlocksStored, BlocksEvicted
                               the step's block changes (step.blocks_allocated.*, step.prefix_hits.*, ...)
    EngineIdle                 after a step that left nothing running or waiting

What a trace does not keep stays empty: the stored blocks' hashes, a request's ``stop_reason``, the
request a block was evicted for, a step's host parts. A prefix lookup's "never stored", "evicted" and
"cleared" (the tracer's finer reasons) are the engine's ``not_cached`` again.

The order is one the engine could have recorded. Between steps come the requests queued (and those
aborted) then; inside a step, the order of ``Scheduler.schedule`` and ``update_from_output``::

    StepStarted
    RequestPreempted + BlocksFreed         running requests evicted to make room
    BlocksEvicted                          cached blocks handed out again
    BlocksAllocated                        running requests growing
    RequestScheduled/Resumed + PrefixCacheHit + BlocksAllocated    admissions, in time order
    RequestWaiting                         those left waiting, and why
    BlocksStored                           blocks that became full
    RequestFinished + BlocksFreed
    StepRecord
    EngineIdle                             when the step left nothing to do

So replaying a step's events from the first step on gives, at each ``StepRecord``, the block tables
the engine had after that step (``viz/blocks.py``'s replay of the same changes).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tracevllm.core.events import (
    BatchScheduled, BlocksAllocated, BlocksEvicted, BlocksFreed, BlocksStored, EngineEvent, EngineIdle,
    PrefixCacheHit, PrefixCacheLookup, RequestFinished, RequestPreempted, RequestQueued, RequestResumed,
    RequestScheduled, RequestWaiting, ScheduledRequest, StepGauges, StepRecord, StepStarted,
)
from tracevllm.tracing.schema import STEP_STAGES, Attr, EventName, SpanName, block_change_keys
from viz.blocks import unflatten
from viz.model import Span, SpanEvent, Step, Trace

ENGINE_MISS_REASONS = ("partial_block", "not_cached", "prefix_caching_off", "prompt_logprobs")


@dataclass(frozen=True, slots=True)
class TimedEvent:
    """An engine event and when it happened (seconds since the epoch, as the engine's timestamps)."""

    time: float
    event: EngineEvent


@dataclass
class _StepEvents:
    """One step's request events, sorted into the groups the step's order needs."""

    preempted: list[tuple[float, SpanEvent, Span]] = field(default_factory=list)
    admitted: list[tuple[float, SpanEvent, Span]] = field(default_factory=list)
    waiting: list[tuple[float, SpanEvent, Span]] = field(default_factory=list)
    finished: list[tuple[float, SpanEvent, Span]] = field(default_factory=list)


def _traceparent(span: Span) -> dict[str, str]:
    """The W3C trace headers that name the request's trace and its llm_request (the span's parent)."""
    return {"traceparent": f"00-{span.trace_id}-{span.parent_id or span.span_id}-01"}


def _request_event(e: SpanEvent, span: Span, time: float) -> EngineEvent:
    """A scheduler.request span event as the engine event it was made from."""
    a, request_id = e.attributes, span.attributes[Attr.REQUEST_ID]
    if e.name == EventName.QUEUED:
        return RequestQueued(request_id, time, span.attributes[Attr.NUM_PROMPT_TOKENS],
                             span.attributes.get(Attr.PRIORITY, 0), _traceparent(span))
    if e.name == EventName.WAITING:
        return RequestWaiting(request_id, time, a[Attr.WAITING_REASON], list(a.get(Attr.BLOCKED_BY, [])),
                              a.get(Attr.NUM_BLOCKS_NEEDED, 0), a.get(Attr.NUM_FREE_BLOCKS, 0),
                              a.get(Attr.FULL_SEQUENCE, False), a.get(Attr.NUM_WATERMARK_BLOCKS, 0))
    if e.name in (EventName.SCHEDULED, EventName.RESUMED):
        lookup = None
        if Attr.PREFIX_MISS_REASON in a:
            reason = a[Attr.PREFIX_MISS_REASON]
            lookup = PrefixCacheLookup(a.get(Attr.PREFIX_NUM_BLOCKS_LOOKED_UP, 0), a.get(Attr.PREFIX_NUM_BLOCKS_HIT, 0),
                                       reason if reason in ENGINE_MISS_REASONS else "not_cached")
        kind = RequestResumed if e.name == EventName.RESUMED else RequestScheduled
        return kind(request_id, time, a.get(Attr.NUM_NEW_TOKENS, 0), a.get(Attr.NUM_COMPUTED_TOKENS, 0),
                    list(a.get(Attr.CACHED_BLOCK_IDS, [])), list(a.get(Attr.BLOCK_IDS, [])), lookup)
    if e.name == EventName.PREEMPTED:
        return RequestPreempted(request_id, time, a.get(Attr.NUM_OUTPUT_TOKENS, 0), list(a.get(Attr.BLOCK_IDS, [])),
                                a.get(Attr.FORCED_BY, ""), a.get(Attr.NUM_BLOCKS_NEEDED, 0),
                                a.get(Attr.NUM_FREE_BLOCKS, 0), a.get(Attr.PREEMPTION_POLICY, "fcfs"),
                                a.get(Attr.NUM_LOST_TOKENS, 0))
    s = span.attributes
    return RequestFinished(request_id, time, a.get(Attr.EVENT_FINISH_REASON, s.get(Attr.FINISH_REASON, "stop")),
                           None, s.get(Attr.NUM_OUTPUT_TOKENS, 0), s.get(Attr.NUM_PREEMPTIONS, 0),
                           s.get(Attr.NUM_CACHED_TOKENS, 0), list(a.get(Attr.BLOCK_IDS, [])))


def _stage_durations(spans: tuple[Span, ...]) -> dict[str, dict[str, float]]:
    """Each engine_step span's id: its stages' durations in seconds, from its stage spans."""
    durations: dict[str, dict[str, float]] = defaultdict(dict)
    for s in spans:
        if s.name in STEP_STAGES and s.parent_id is not None:
            durations[s.parent_id][s.name] = (s.end_ns - s.start_ns) / 1e9
    return durations


def _step_record(step: Step, span: Span, start: float, durations: dict[str, float]) -> StepRecord:
    computed = step.req_num_computed_tokens or (0,) * len(step.req_ids)
    batch = BatchScheduled(
        [ScheduledRequest(r, n, d, c) for r, n, d, c in zip(step.req_ids, step.req_num_tokens, step.req_is_decode,
                                                            computed)],
        list(step.preempted_req_ids), step.token_budget, step.num_scheduled_tokens)
    gauges = StepGauges(step.num_free_blocks, step.num_gpu_blocks, step.kv_cache_usage, step.num_running_reqs,
                        step.num_waiting_reqs)
    return StepRecord(step.number, start, durations or {"engine_step": (span.end_ns - span.start_ns) / 1e9},
                      batch, gauges)


def _without(block_ids: tuple[int, ...], taken: Counter) -> list[int]:
    """``block_ids`` less those in ``taken``, counted as a multiset (``taken`` loses what it gives)."""
    rest = []
    for block_id in block_ids:
        if taken[block_id] > 0:
            taken[block_id] -= 1
        else:
            rest.append(block_id)
    return rest


def _sort_request_events(trace: Trace, steps: tuple[Step, ...]
                         ) -> tuple[dict[int, list[tuple[float, SpanEvent, Span]]], dict[int, _StepEvents]]:
    """Every scheduler.request event, either between steps (``between[i]``: before ``steps[i]``, or after
    the last one for ``i == len(steps)``) or inside the step of its number."""
    starts = [s.start for s in steps]
    index = {s.number: i for i, s in enumerate(steps)}
    between: dict[int, list] = defaultdict(list)
    inside: dict[int, _StepEvents] = defaultdict(_StepEvents)
    for span in (s for s in trace.spans if s.name == SpanName.SCHEDULER_REQUEST):
        first_admission = min((index.get(e.attributes[Attr.STEP], len(steps)) for e in span.events
                               if e.name in (EventName.SCHEDULED, EventName.RESUMED)), default=len(steps))
        for e in span.events:
            time = (e.time_ns - trace.t0_ns) / 1e9  # seconds since the trace's t0, as the steps'
            item = (e.time_ns / 1e9, e, span)
            if e.name == EventName.QUEUED:
                between[min(bisect.bisect_right(starts, time), first_admission)].append(item)
            elif e.name == EventName.FINISHED:
                # In the last step that started before it, if that step ran it (its last token) or
                # had not ended yet (an abort); else between steps.
                i = bisect.bisect_right(starts, time) - 1
                if i >= 0 and (span.attributes[Attr.REQUEST_ID] in steps[i].req_ids or time <= steps[i].end):
                    inside[steps[i].number].finished.append(item)
                else:
                    between[i + 1].append(item)  # aborted between steps
            elif e.name in (EventName.SCHEDULED, EventName.RESUMED):
                inside[e.attributes[Attr.STEP]].admitted.append(item)
            elif e.name == EventName.PREEMPTED:
                inside[e.attributes[Attr.STEP]].preempted.append(item)
            elif e.name == EventName.WAITING:
                inside[e.attributes[Attr.STEP]].waiting.append(item)
    return between, inside


def trace_events(trace: Trace) -> list[TimedEvent]:
    """The engine events of ``trace``'s run, in an order the engine could have recorded them (see the
    module's docstring). ValueError for a trace without engine steps (``--trace-level request``)."""
    steps = trace.require_steps()
    t0 = trace.t0_ns / 1e9
    step_spans = {s.attributes[Attr.STEP_NUMBER]: s for s in trace.spans if s.name == SpanName.ENGINE_STEP}
    durations = _stage_durations(trace.spans)
    between, inside = _sort_request_events(trace, steps)
    # A request's dropped references are told twice: by its PREEMPTED or FINISHED event (emitted with
    # it) and by the step's step.blocks_freed.* (the same step, or the next for a request aborted
    # between steps). Only what the step lists beyond the events is emitted from the step.
    told_freed: dict[str, Counter] = defaultdict(Counter)
    out: list[TimedEvent] = []

    def emit_request_events(items: list[tuple[float, SpanEvent, Span]]) -> None:
        for time, e, span in sorted(items, key=lambda item: item[0]):
            event = _request_event(e, span, time)
            out.append(TimedEvent(time, event))
            if isinstance(event, (RequestPreempted, RequestFinished)) and event.block_ids:
                told_freed[event.request_id].update(event.block_ids)
                out.append(TimedEvent(time, BlocksFreed(event.request_id, event.block_ids)))

    for i, step in enumerate(steps):
        emit_request_events(between.get(i, []))
        span, start = step_spans[step.number], t0 + step.start
        events = inside.get(step.number, _StepEvents())
        admitted = {s.attributes[Attr.REQUEST_ID] for _, _, s in events.admitted}
        out.append(TimedEvent(start, StepStarted(step.number, start)))
        emit_request_events([item for item in events.preempted if item[2].attributes[Attr.REQUEST_ID] not in admitted])
        if evicted := span.attributes.get(Attr.STEP_BLOCKS_EVICTED):
            out.append(TimedEvent(start, BlocksEvicted(list(evicted))))
        for request_id, block_ids in step.blocks_allocated.items():
            if request_id not in admitted:
                out += _allocations(start, request_id, block_ids, step.prefix_hits.get(request_id, ()), 0)
        for time, e, s in sorted(events.admitted, key=lambda item: item[0]):
            request_id = s.attributes[Attr.REQUEST_ID]
            out.append(TimedEvent(time, _request_event(e, s, time)))
            out += _allocations(time, request_id, step.blocks_allocated.get(request_id, ()),
                                step.prefix_hits.get(request_id, ()), e.attributes.get(Attr.NUM_COMPUTED_TOKENS, 0))
            # The priority policy may preempt a request in the step that scheduled it.
            emit_request_events([item for item in events.preempted if item[2] is s])
        emit_request_events(events.waiting)
        end = t0 + step.end
        for request_id, block_ids in _block_changes(span, Attr.STEP_BLOCKS_STORED).items():
            out.append(TimedEvent(end, BlocksStored(request_id, list(block_ids))))
        emit_request_events(events.finished)
        for request_id, block_ids in step.blocks_freed.items():
            if rest := _without(block_ids, told_freed[request_id]):
                out.append(TimedEvent(end, BlocksFreed(request_id, rest)))
        out.append(TimedEvent(end, _step_record(step, span, start, durations.get(span.span_id, {}))))
        if step.num_running_reqs == 0 and step.num_waiting_reqs == 0:
            out.append(TimedEvent(end, EngineIdle(end)))
    emit_request_events(between.get(len(steps), []))
    return out


def _allocations(time: float, request_id: str, block_ids: tuple[int, ...], prefix_hits: tuple[int, ...],
                 num_cached_tokens: int) -> list[TimedEvent]:
    """A request's references taken in a step: its prefix-cache hits, then its new blocks."""
    new = _without(block_ids, Counter(prefix_hits))
    events = []
    if prefix_hits:
        events.append(TimedEvent(time, PrefixCacheHit(request_id, list(prefix_hits), num_cached_tokens)))
    if new:
        events.append(TimedEvent(time, BlocksAllocated(request_id, new)))
    return events


def _block_changes(span: Span, prefix: str) -> dict[str, tuple[int, ...]]:
    return unflatten(*(span.attributes.get(key, []) for key in block_change_keys(prefix)))
