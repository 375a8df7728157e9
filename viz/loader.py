"""``load_trace(directory) -> Trace``: the spans of a ``--trace-out`` directory, rebuilt into
requests and engine steps (docs/tracing.md defines every span and attribute read here).

- **Requests** are keyed by their ``scheduler.request`` span (the engine-core request id,
  ``gen_ai.request.id``): its events give the admissions, preemptions, prefix-cache hits and the
  finish; its ``llm_request`` root (the parent, or failing that the same trace) the latencies.
- **Steps** are the ``engine_step`` spans in ``step.number`` order, their block changes replayed
  (``viz/blocks.py``); each request gets a ``Chunk`` per step that ran it.

One directory holds one engine's run: step numbers and request ids must not repeat.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Sequence

from viz.blocks import replay_blocks, unflatten
from viz.model import Admission, Chunk, PrefixHit, Request, Span, Step, Trace
from viz.otlp import read_spans
from viz.segments import request_segments

ONE_RUN = "the directory holds more than one engine run; record each run into a directory of its own"


def _repeated(values: Sequence) -> list:
    return [v for v, n in Counter(values).items() if n > 1]


def _block_changes(a: dict, kind: str) -> dict[str, tuple[int, ...]]:
    prefix = f"step.blocks_{kind}"
    return unflatten(a.get(f"{prefix}.req_ids", []), a.get(f"{prefix}.num", []), a.get(f"{prefix}.block_ids", []))


def _prefix_hits(step_spans: Sequence[Span], spans: Sequence[Span]) -> list[dict[str, tuple[int, ...]]]:
    """Per step, the blocks each request took from the prefix cache (its ``kv.prefix_cache_hit``
    events, which happen inside the step's ``schedule``)."""
    starts = [s.start_ns for s in step_spans]
    hits: list[dict[str, tuple[int, ...]]] = [{} for _ in step_spans]
    for span in spans:
        if span.name != "scheduler.request":
            continue
        for event in span.events:
            i = bisect.bisect_right(starts, event.time_ns) - 1
            if event.name == "kv.prefix_cache_hit" and i >= 0 and event.time_ns <= step_spans[i].end_ns:
                hits[i][span.attributes["gen_ai.request.id"]] = tuple(event.attributes["block_ids"])
    return hits


def _steps(spans: Sequence[Span], seconds: Callable[[int], float]) -> tuple[Step, ...]:
    step_spans = sorted((s for s in spans if s.name == "engine_step"), key=lambda s: s.attributes["step.number"])
    if repeated := _repeated([s.attributes["step.number"] for s in step_spans]):
        raise ValueError(f"step numbers {repeated[:5]} repeat: {ONE_RUN}")
    changes = [(s.attributes["step.number"], _block_changes(s.attributes, "allocated"),
                _block_changes(s.attributes, "freed")) for s in step_spans]
    held = replay_blocks(changes)
    hits = _prefix_hits(step_spans, spans)
    steps = []
    for span, (number, taken, dropped), held_after, step_hits in zip(step_spans, changes, held, hits):
        a = span.attributes
        try:
            steps.append(Step(
                number, seconds(span.start_ns), seconds(span.end_ns), tuple(a["step.req_ids"]),
                tuple(a["step.req_num_tokens"]), tuple(a["step.req_is_decode"]), tuple(a["step.preempted_req_ids"]),
                a["step.token_budget"], a["step.num_scheduled_tokens"], a["step.num_free_blocks"],
                a["step.num_gpu_blocks"], a["step.kv_cache_usage"], a["step.num_running_reqs"],
                a["step.num_waiting_reqs"], taken, dropped, step_hits, held_after,
            ))
        except KeyError as e:
            raise ValueError(f"engine_step {number} lacks the attribute {e}") from e
    return tuple(steps)


def _chunks(steps: Sequence[Step]) -> dict[str, list[Chunk]]:
    chunks: dict[str, list[Chunk]] = {}
    for step in steps:
        for req_id, n, is_decode in zip(step.req_ids, step.req_num_tokens, step.req_is_decode):
            chunks.setdefault(req_id, []).append(Chunk(step.number, step.start, step.end, n, is_decode))
    return chunks


def _request(span: Span, root: Span | None, chunks: Sequence[Chunk], seconds: Callable[[int], float]) -> Request:
    a = span.attributes
    events = {name: [e for e in span.events if e.name == name]
              for name in ("QUEUED", "PREEMPTED", "kv.prefix_cache_hit", "FINISHED")}
    admissions, num_tokens = [], a["request.num_prompt_tokens"]
    for e in span.events:
        if e.name == "PREEMPTED":
            num_tokens = a["request.num_prompt_tokens"] + e.attributes["num_output_tokens"]
        elif e.name == "SCHEDULED":
            admissions.append(Admission(seconds(e.time_ns), num_tokens, e.attributes["num_computed_tokens"],
                                        e.attributes["resumed"]))
    preemptions = tuple(seconds(e.time_ns) for e in events["PREEMPTED"])
    queued = seconds(events["QUEUED"][0].time_ns if events["QUEUED"] else span.start_ns)
    finished = seconds(events["FINISHED"][0].time_ns if events["FINISHED"] else span.end_ns)
    finish_reason = events["FINISHED"][0].attributes.get("finish_reason") if events["FINISHED"] else None
    latency = root.attributes if root is not None else {}
    arrival = seconds(root.start_ns) if root is not None else queued
    ttft = latency.get("gen_ai.latency.time_to_first_token")
    first_token = None if ttft is None else arrival + ttft
    return Request(
        request_id=a["gen_ai.request.id"], trace_id=span.trace_id,
        num_prompt_tokens=a["request.num_prompt_tokens"], num_output_tokens=a.get("request.num_output_tokens", 0),
        num_preemptions=a.get("request.num_preemptions", len(preemptions)),
        finish_reason=None if finish_reason in (None, "None") else finish_reason,
        arrival=arrival, queued=queued, finished=finished, first_token=first_token,
        admissions=tuple(admissions), preemptions=preemptions,
        prefix_hits=tuple(PrefixHit(seconds(e.time_ns), tuple(e.attributes["block_ids"]),
                                    e.attributes["num_cached_tokens"]) for e in events["kv.prefix_cache_hit"]),
        chunks=tuple(chunks),
        segments=request_segments(queued, [x.time for x in admissions], preemptions, finished, first_token, chunks),
        time_in_queue=latency.get("gen_ai.latency.time_in_queue"), ttft=ttft,
        e2e=latency.get("gen_ai.latency.e2e"), decode_time=latency.get("gen_ai.latency.time_in_model_decode"),
    )


def _requests(spans: Sequence[Span], steps: Sequence[Step], seconds: Callable[[int], float]) -> dict[str, Request]:
    roots = [s for s in spans if s.name == "llm_request"]
    by_id, by_trace = {s.span_id: s for s in roots}, {s.trace_id: s for s in roots}
    sched = [s for s in spans if s.name == "scheduler.request"]
    if repeated := _repeated([s.attributes["gen_ai.request.id"] for s in sched]):
        raise ValueError(f"request ids {repeated[:5]} repeat: {ONE_RUN}")
    chunks = _chunks(steps)
    requests = [_request(s, by_id.get(s.parent_id) or by_trace.get(s.trace_id),
                         chunks.get(s.attributes["gen_ai.request.id"], []), seconds) for s in sched]
    return {r.request_id: r for r in sorted(requests, key=lambda r: (r.arrival, r.queued))}


def load_trace(directory: str) -> Trace:
    """Load every ``tracevllm-*.jsonl`` file of ``directory`` (ValueError if there is none)."""
    spans = sorted(read_spans(str(directory)), key=lambda s: (s.start_ns, s.end_ns))
    t0_ns = spans[0].start_ns

    def seconds(time_ns: int) -> float:
        return (time_ns - t0_ns) / 1e9

    steps = _steps(spans, seconds)
    return Trace(str(directory), t0_ns, tuple(spans), _requests(spans, steps, seconds), steps)
