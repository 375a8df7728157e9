"""The "why" of each request, written onto its spans when recorded traces are exported.

``tracevllm traces jaeger`` and ``traces push`` run ``explain.py`` over each step-level
``--trace-out`` directory they are given, and add the explanation to the spans they send:
``why.<part>`` (seconds; ``viz.explain.PARTS``) and the requests blamed most
(``why.blamed.request_ids``, ``why.blamed.seconds``), on each ``scheduler.request`` span and on its
``llm_request`` when that has one engine-core request (``n`` = 1), so Jaeger shows them where a
request's latency is read. The files on disk stay as recorded: the explanation needs the whole run
(its cost model is fitted over every step), which no span has while it is being recorded.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from tracevllm.tracing.schema import Attr, SpanName
from viz.explain import explain
from viz.trace_loader import load_trace

MAX_BLAMED = 5


def _value(value: float | str | list) -> AnyValue:
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[_value(v) for v in value]))
    if isinstance(value, str):
        return AnyValue(string_value=value)
    return AnyValue(double_value=value)


def why_attributes(directory: str) -> dict[str, dict[str, float | list]]:
    """Span id (hex) -> the attributes to add, for a step-level trace directory; {} for any other."""
    trace = load_trace(directory)
    if not trace.has_steps:
        return {}
    spans = {s.attributes.get(Attr.REQUEST_ID): s for s in trace.spans if s.name == SpanName.SCHEDULER_REQUEST}
    children = Counter(s.parent_id for s in spans.values())
    out: dict[str, dict[str, float | list]] = {}
    for x in explain(trace):
        blamed = sorted(x.blamed.items(), key=lambda kv: -kv[1])[:MAX_BLAMED]
        attributes = {f"{Attr.WHY_PREFIX}{part}": seconds for part, seconds in x.parts.items()}
        attributes[Attr.WHY_BLAMED_REQUEST_IDS] = [r for r, _ in blamed]
        attributes[Attr.WHY_BLAMED_SECONDS] = [s for _, s in blamed]
        span = spans[x.request_id]
        out[span.span_id] = attributes
        if span.parent_id is not None and children[span.parent_id] == 1:
            out[span.parent_id] = attributes
    return out


def add_why_attributes(requests: list[ExportTraceServiceRequest], paths: list[str]) -> int:
    """Add the explanations of the step-level directories among ``paths`` to their spans in
    ``requests`` (in place); returns the number of spans that gained them. A directory that cannot
    be explained (not one engine's run, or spans this version does not read) is exported as it is,
    with a line on stderr saying why."""
    attributes: dict[str, dict[str, float | list]] = {}
    for path in paths:
        if os.path.isdir(path):
            try:
                attributes.update(why_attributes(path))
            except (ValueError, KeyError) as e:
                print(f"{path}: exported without why.* attributes: {e}", file=sys.stderr)
    n = 0
    for request in requests:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    extra = attributes.get(span.span_id.hex())
                    if extra:
                        span.attributes.extend(KeyValue(key=k, value=_value(v)) for k, v in extra.items())
                        n += 1
    return n
