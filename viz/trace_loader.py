"""``load_trace(directory) -> Trace``: the spans of a ``--trace-out`` directory, rebuilt into
requests and engine steps. Every name read here comes from ``tracevllm.tracing.schema``, the module
the tracer writes them from (it imports nothing: viz still needs neither torch nor the engine).

- **Requests** are keyed by their ``scheduler.request`` span (the engine-core request id,
  ``request.id``): its events give the admissions (with their prefix-cache hits), preemptions and
  the finish; its ``llm_request`` root (the parent, or failing that the same trace) the latencies.
- **Steps** are the ``engine_step`` spans in ``step.number`` order, their block changes replayed
  (``viz/blocks.py``); each request gets a ``Chunk`` per step that ran it.

One directory holds one engine's run: step numbers and request ids must not repeat.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

from tracevllm.tracing.schema import STARTUP_SPANS, Attr, EventName, SpanName, VllmAttr, block_change_keys
from viz.blocks import replay_blocks, unflatten
from viz.model import Admission, Chunk, Preemption, PrefixHit, Request, Span, Step, Trace, Wait, WorkerRun
from viz.otlp import read_spans
from viz.segments import request_segments

# What the requests and the engine steps are built from (``load_trace(..., REQUEST_AND_STEP_SPANS)``).
REQUEST_AND_STEP_SPANS = frozenset({SpanName.LLM_REQUEST, SpanName.SCHEDULER_REQUEST, SpanName.ENGINE_STEP})
ONE_RUN = "the directory holds more than one engine run; record each run into a directory of its own"


def _repeated(values: Sequence) -> list:
    return [v for v, n in Counter(values).items() if n > 1]


_BLOCK_CHANGE_KEYS = {prefix: block_change_keys(prefix) for prefix in (
    Attr.STEP_BLOCKS_ALLOCATED, Attr.STEP_BLOCKS_FREED, Attr.STEP_PREFIX_HITS)}


def _block_changes(a: dict, prefix: str) -> dict[str, tuple[int, ...]]:
    return unflatten(*(a.get(key, []) for key in _BLOCK_CHANGE_KEYS[prefix]))


def _steps(spans: Sequence[Span], seconds: Callable[[int], float]) -> tuple[Step, ...]:
    step_spans = sorted((s for s in spans if s.name == SpanName.ENGINE_STEP),
                        key=lambda s: s.attributes[Attr.STEP_NUMBER])
    if repeated := _repeated([s.attributes[Attr.STEP_NUMBER] for s in step_spans]):
        raise ValueError(f"step numbers {repeated[:5]} repeat: {ONE_RUN}")
    changes = [(s.attributes[Attr.STEP_NUMBER], _block_changes(s.attributes, Attr.STEP_BLOCKS_ALLOCATED),
                _block_changes(s.attributes, Attr.STEP_BLOCKS_FREED)) for s in step_spans]
    held = replay_blocks(changes)
    steps = []
    for span, (number, taken, dropped), held_after in zip(step_spans, changes, held):
        a = span.attributes
        try:
            steps.append(Step(
                number, seconds(span.start_ns), seconds(span.end_ns), tuple(a[Attr.STEP_REQ_IDS]),
                tuple(a[Attr.STEP_REQ_NUM_TOKENS]), tuple(a[Attr.STEP_REQ_IS_DECODE]),
                tuple(a[Attr.STEP_PREEMPTED_REQ_IDS]), a[Attr.STEP_TOKEN_BUDGET], a[Attr.STEP_NUM_SCHEDULED_TOKENS],
                a[Attr.STEP_NUM_FREE_BLOCKS], a[Attr.STEP_NUM_GPU_BLOCKS], a[Attr.STEP_KV_CACHE_USAGE],
                a[Attr.STEP_NUM_RUNNING_REQS], a[Attr.STEP_NUM_WAITING_REQS], taken, dropped,
                _block_changes(a, Attr.STEP_PREFIX_HITS), held_after,
                tuple(a.get(Attr.STEP_REQ_NUM_COMPUTED_TOKENS, ())),
                tuple(zip(a.get(Attr.STEP_ONE_TIME_COSTS, ()), a.get(Attr.STEP_ONE_TIME_COST_SECONDS, ()))),
                a.get(Attr.STEP_CPU_THREADS_PROBE_SECONDS, 0.0),
            ))
        except KeyError as e:
            raise ValueError(f"{SpanName.ENGINE_STEP} {number} lacks the attribute {e}") from e
    return tuple(steps)


def _chunks(steps: Sequence[Step]) -> dict[str, list[Chunk]]:
    chunks: dict[str, list[Chunk]] = {}
    for step in steps:
        for req_id, n, is_decode in zip(step.req_ids, step.req_num_tokens, step.req_is_decode):
            chunks.setdefault(req_id, []).append(Chunk(step.number, step.start, step.end, n, is_decode))
    return chunks


def _request(span: Span, root: Span | None, chunks: Sequence[Chunk], seconds: Callable[[int], float]) -> Request:
    a = span.attributes
    admissions, prefix_hits, preemptions, preempted, waits = [], [], [], [], []
    num_tokens, queued, finished, finish_reason = a[Attr.NUM_PROMPT_TOKENS], None, None, None
    for e in span.events:
        time, ea = seconds(e.time_ns), e.attributes
        if e.name == EventName.QUEUED:
            queued = time
        elif e.name == EventName.WAITING:
            waits.append(Wait(time, ea[Attr.STEP], ea[Attr.WAITING_REASON], tuple(ea.get(Attr.BLOCKED_BY, ())),
                              ea.get(Attr.NUM_BLOCKS_NEEDED, 0), ea.get(Attr.NUM_FREE_BLOCKS, 0),
                              ea.get(Attr.FULL_SEQUENCE, False), ea.get(Attr.NUM_WATERMARK_BLOCKS, 0)))
        elif e.name == EventName.PREEMPTED:
            preemptions.append(time)
            num_tokens = a[Attr.NUM_PROMPT_TOKENS] + ea[Attr.NUM_OUTPUT_TOKENS]
            if Attr.FORCED_BY in ea:
                preempted.append(Preemption(time, ea[Attr.STEP], ea[Attr.FORCED_BY], ea[Attr.NUM_BLOCKS_NEEDED],
                                            ea[Attr.NUM_FREE_BLOCKS], ea[Attr.PREEMPTION_POLICY],
                                            ea[Attr.NUM_LOST_TOKENS]))
        elif e.name in (EventName.SCHEDULED, EventName.RESUMED):
            num_computed = ea[Attr.NUM_COMPUTED_TOKENS]
            admissions.append(Admission(
                time, num_tokens, num_computed, e.name == EventName.RESUMED, ea.get(Attr.STEP, 0),
                ea.get(Attr.PREFIX_NUM_BLOCKS_LOOKED_UP, 0), ea.get(Attr.PREFIX_NUM_BLOCKS_HIT, 0),
                ea.get(Attr.PREFIX_MISS_REASON), ea.get(Attr.PREFIX_MISS_EVICTED_STEP),
                ea.get(Attr.PREFIX_MISS_EVICTED_FOR),
            ))
            if num_computed:
                prefix_hits.append(PrefixHit(time, tuple(ea[Attr.CACHED_BLOCK_IDS]), num_computed))
        elif e.name == EventName.FINISHED:
            finished, finish_reason = time, e.attributes.get(Attr.EVENT_FINISH_REASON)
    queued = seconds(span.start_ns) if queued is None else queued
    finished = seconds(span.end_ns) if finished is None else finished
    latency = root.attributes if root is not None else {}
    arrival = seconds(root.start_ns) if root is not None else queued
    ttft = latency.get(VllmAttr.LATENCY_TIME_TO_FIRST_TOKEN)
    first_token = None if ttft is None else arrival + ttft
    return Request(
        request_id=a[Attr.REQUEST_ID], trace_id=span.trace_id,
        num_prompt_tokens=a[Attr.NUM_PROMPT_TOKENS], num_output_tokens=a.get(Attr.NUM_OUTPUT_TOKENS, 0),
        num_preemptions=a.get(Attr.NUM_PREEMPTIONS, len(preemptions)), finish_reason=finish_reason,
        arrival=arrival, queued=queued, finished=finished, first_token=first_token,
        admissions=tuple(admissions), preemptions=tuple(preemptions), prefix_hits=tuple(prefix_hits),
        chunks=tuple(chunks),
        segments=request_segments(queued, [x.time for x in admissions], preemptions, finished, first_token, chunks),
        time_in_queue=latency.get(VllmAttr.LATENCY_TIME_IN_QUEUE), ttft=ttft,
        e2e=latency.get(VllmAttr.LATENCY_E2E), decode_time=latency.get(VllmAttr.LATENCY_TIME_IN_MODEL_DECODE),
        waits=tuple(waits), preempted=tuple(preempted),
        parent_request_id=latency.get(VllmAttr.REQUEST_ID), n=latency.get(VllmAttr.REQUEST_N, 1),
    )


def _requests(spans: Sequence[Span], steps: Sequence[Step], seconds: Callable[[int], float]) -> dict[str, Request]:
    roots = [s for s in spans if s.name == SpanName.LLM_REQUEST]
    by_id, by_trace = {s.span_id: s for s in roots}, {s.trace_id: s for s in roots}
    sched = [s for s in spans if s.name == SpanName.SCHEDULER_REQUEST]
    if repeated := _repeated([s.attributes[Attr.REQUEST_ID] for s in sched]):
        raise ValueError(f"request ids {repeated[:5]} repeat: {ONE_RUN}")
    chunks = _chunks(steps)
    requests = [_request(s, by_id.get(s.parent_id) or by_trace.get(s.trace_id),
                         chunks.get(s.attributes[Attr.REQUEST_ID], []), seconds) for s in sched]
    return {r.request_id: r for r in sorted(requests, key=lambda r: (r.arrival, r.queued))}


def _worker_runs(spans: Sequence[Span], seconds: Callable[[int], float]) -> tuple[WorkerRun, ...]:
    step_numbers = {s.span_id: s.attributes.get(Attr.STEP_NUMBER) for s in spans if s.name == SpanName.ENGINE_STEP}
    children: dict[str, dict[str, float]] = {}
    for s in spans:
        if s.name in (SpanName.PP_RECV, SpanName.PP_SEND) and s.parent_id is not None:
            children.setdefault(s.parent_id, {})[s.name] = (s.end_ns - s.start_ns) / 1e9
    runs = []
    for s in spans:
        if s.name != SpanName.WORKER_EXECUTE_MODEL:
            continue
        a, parts = s.attributes, children.get(s.span_id, {})
        runs.append(WorkerRun(
            a[Attr.WORKER_RANK], a[Attr.WORKER_TP_RANK], a[Attr.WORKER_PP_RANK], step_numbers.get(s.parent_id),
            seconds(s.start_ns), seconds(s.end_ns), a[Attr.WORKER_NUM_TOKENS], parts.get(SpanName.PP_RECV, 0.0),
            parts.get(SpanName.PP_SEND, 0.0), a[Attr.WORKER_COMM_TIME],
        ))
    return tuple(runs)


def load_trace(directory: str, span_names: Collection[str] | None = None) -> Trace:
    """Load every ``tracevllm-*.jsonl`` file of ``directory`` (ValueError if there is none).

    ``span_names`` reads only the spans so named, skipping the others undecoded: with
    ``REQUEST_AND_STEP_SPANS`` the requests and steps are whole (``traces diff`` reads no more), the
    stages, workers and front-end children are missing (and time 0 is the first request's arrival, not
    a served request's HTTP span a few ms before it).
    """
    # Millions of small objects and no reference cycles among them: the cyclic garbage collector
    # would walk them again at every threshold it crosses (a fifth of the time on 10,000 steps).
    with cyclic_gc_paused():
        spans = sorted(read_spans(str(directory), span_names), key=lambda s: (s.start_ns, s.end_ns))
        # Time 0 is the first span of the serving itself: the start-up trace comes before it, with every
        # span in it (the phases, and the one-time costs they paid: a C++ op loaded, a compile).
        startup_traces = {s.trace_id for s in spans if s.name in STARTUP_SPANS}
        t0_ns = next((s.start_ns for s in spans if s.trace_id not in startup_traces), spans[0].start_ns)

        def seconds(time_ns: int) -> float:
            return (time_ns - t0_ns) / 1e9

        steps = _steps(spans, seconds)
        return Trace(str(directory), t0_ns, tuple(spans), _requests(spans, steps, seconds), steps,
                     _worker_runs(spans, seconds))


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: for work that makes many long-lived objects and few
    reference cycles, which the collector would otherwise walk again at every threshold. Objects are
    still freed when their last reference goes; cycles wait for the collector's next run after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
