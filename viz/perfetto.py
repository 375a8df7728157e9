"""``write_perfetto(trace, path)``: Chrome trace-event JSON that ui.perfetto.dev (and chrome://tracing) open.

Every span becomes one ``"X"`` (complete) event, its events ``"i"`` (instant) events, with ``ts`` and
``dur`` in microseconds since the first span. Tracks::

    pid: a process (its resource's process.pid), named "EngineCore (pid 4242)"
      tid: "engine steps"      the engine_step traces, each step with its stages inside
      tid: "request 0"         that request's spans emitted by this process
      tid: "request 0 #2"      a second lane, when needed (below)

On one track the events must nest (a child inside its parent, siblings one after the other). The
spans of a request do not always: ``prefill`` ends when the front end sees the first token, which
can be after ``scheduler.request`` has ended. A span that would cross the span open on its lane
goes to the next lane of the same request instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tracevllm.tracing.schema import SpanName, VllmAttr
from viz.model import Span, Trace

STEPS_TRACK = "engine steps"


def _track_names(trace: Trace) -> dict[str, str]:
    """Each trace id's track name: the engine steps, or the request (engine-core ids) it carries."""
    request_ids: dict[str, list[str]] = {}
    for request in trace.requests.values():
        request_ids.setdefault(request.trace_id, []).append(request.request_id)
    tracks = {trace_id: "request " + ", ".join(ids) for trace_id, ids in request_ids.items()}
    for span in trace.spans:
        if span.name == SpanName.ENGINE_STEP:
            tracks[span.trace_id] = STEPS_TRACK
        elif span.name == SpanName.LLM_REQUEST and span.trace_id not in tracks:
            tracks[span.trace_id] = f"request {span.attributes.get(VllmAttr.REQUEST_ID, span.trace_id[:8])}"
    return tracks


def _lanes(spans: Sequence[Span]) -> list[list[Span]]:
    """The spans split into lanes in which they nest properly, the first lanes as full as possible."""
    lanes: list[list[Span]] = []
    open_ends: list[list[int]] = []  # per lane, the end times of the spans still open (a stack)
    for span in sorted(spans, key=lambda s: (s.start_ns, -s.end_ns)):
        for lane, stack in zip(lanes, open_ends):
            while stack and stack[-1] <= span.start_ns:
                stack.pop()
            if not stack or span.end_ns <= stack[-1]:
                break
        else:
            lanes.append([])
            open_ends.append([])
            lane, stack = lanes[-1], open_ends[-1]
        lane.append(span)
        stack.append(span.end_ns)
    return lanes


def trace_events(trace: Trace) -> list[dict]:
    track_of = _track_names(trace)
    groups: dict[tuple[int, str], list[Span]] = {}
    processes = {}
    for span in trace.spans:
        name = track_of.get(span.trace_id, f"trace {span.trace_id[:8]}")
        groups.setdefault((span.process.pid, name), []).append(span)
        processes[span.process.pid] = span.process

    def micros(time_ns: int) -> float:
        return (time_ns - trace.t0_ns) / 1e3

    events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{p.name or p.service} (pid {pid})"}}
              for pid, p in processes.items()]
    # The steps' track first, then the requests in the order they came.
    order = sorted(groups, key=lambda key: (key[1] != STEPS_TRACK, min(s.start_ns for s in groups[key])))
    tid = 0
    for pid, name in order:
        for n, lane in enumerate(_lanes(groups[pid, name]), 1):
            tid += 1
            label = name if n == 1 else f"{name} #{n}"
            events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}},
                       {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": tid}}]
            for span in lane:
                ids = {"trace_id": span.trace_id, "span_id": span.span_id, "parent_span_id": span.parent_id}
                events.append({"ph": "X", "name": span.name, "cat": "span", "pid": pid, "tid": tid,
                               "ts": micros(span.start_ns), "dur": (span.end_ns - span.start_ns) / 1e3,
                               "args": {**span.attributes, **ids}})
                events += [{"ph": "i", "s": "t", "name": e.name, "cat": "event", "pid": pid, "tid": tid,
                            "ts": micros(e.time_ns), "args": e.attributes} for e in span.events]
    return events


def write_perfetto(trace: Trace, path: str) -> str:
    """Write the trace-event JSON to ``path``; returns ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": trace_events(trace), "displayTimeUnit": "ms"}, f)
    return str(path)
