"""Finished spans as an OTLP/JSON ``ExportTraceServiceRequest``, built straight from the SDK's spans.

OpenTelemetry's Python SDK has no OTLP/JSON encoder: its exporters encode protobuf messages
(``encode_spans``), and protobuf's ``MessageToDict`` turns a message into JSON in pure Python, at
about as much time again as making the spans. The trace files are written on the span processor's
thread, beside the engine's steps, and a what-if replay writes hundreds of thousands of spans, so
this module writes the same document directly: the dict ``MessageToDict(encode_spans(spans),
use_integers_for_enums=True)`` gives, with the ids already in hex (OTLP/JSON's ids are hex, not
protobuf's base64). ``tests/tracing/test_otlp_json.py`` holds it to the library's encoding, field for
field, on the spans of a traced run and on every kind of attribute value.

The rules of protobuf's JSON mapping that show here: 64-bit integers are strings; fields at their
default (0, "", empty lists) are left out, except the one field of a ``oneof`` that is set (an
attribute's ``boolValue: false``); enums are their numbers.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

# OTLP's SpanFlags: the span says whether its parent is remote, and whether it is.
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200


def encode_spans_json(spans: Sequence[ReadableSpan]) -> dict:
    """The OTLP/JSON document of ``spans``: one ``resourceSpans`` entry per resource, one
    ``scopeSpans`` per instrumentation scope, in first-seen order (as ``encode_spans`` groups them)."""
    grouped: dict = {}
    for span in spans:
        grouped.setdefault(span.resource, {}).setdefault(span.instrumentation_scope or None, []).append(_span(span))
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            entry = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        entry = {"resource": _with_attributes({}, resource.attributes), "scopeSpans": scope_spans}
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans} if resource_spans else {}


def _span(span: ReadableSpan) -> dict:
    context = span.get_span_context()
    out: dict = {"traceId": f"{context.trace_id:032x}", "spanId": f"{context.span_id:016x}"}
    if context.trace_state:
        out["traceState"] = ",".join(f"{key}={value}" for key, value in context.trace_state.items())
    if span.parent is not None and span.parent.span_id:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    if span.name:
        out["name"] = span.name
    out["kind"] = span.kind.value + 1  # SpanKind.INTERNAL is 0 in the SDK, SPAN_KIND_INTERNAL 1 in OTLP
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    _with_attributes(out, span.attributes)
    _with_count(out, "droppedAttributesCount", span.dropped_attributes)
    if span.events:
        out["events"] = [_event(e) for e in span.events]
    _with_count(out, "droppedEventsCount", span.dropped_events)
    if span.links:
        out["links"] = [_link(link) for link in span.links]
    _with_count(out, "droppedLinksCount", span.dropped_links)
    out["status"] = _status(span)
    out["flags"] = _flags(span.parent)
    return out


def _event(event) -> dict:
    out = {"timeUnixNano": str(event.timestamp)} if event.timestamp else {}
    _named(out, event.name)
    _with_attributes(out, event.attributes)
    return _with_count(out, "droppedAttributesCount", event.dropped_attributes)


def _link(link) -> dict:
    out = {"traceId": f"{link.context.trace_id:032x}", "spanId": f"{link.context.span_id:016x}"}
    _with_attributes(out, link.attributes)
    _with_count(out, "droppedAttributesCount", link.dropped_attributes)
    out["flags"] = _flags(link.context)
    return out


def _status(span: ReadableSpan) -> dict:
    out: dict = {}
    if span.status.description:
        out["message"] = span.status.description
    if span.status.status_code.value:
        out["code"] = span.status.status_code.value
    return out


def _flags(parent: SpanContext | None) -> int:
    return _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)


def _scope(scope) -> dict:
    if scope is None:
        return {}
    out = _named({}, scope.name)
    if scope.version:
        out["version"] = scope.version
    return _with_attributes(out, scope.attributes)


def _named(out: dict, name: str) -> dict:
    if name:
        out["name"] = name
    return out


def _with_count(out: dict, key: str, count: int) -> dict:
    if count:
        out[key] = count
    return out


def _with_attributes(out: dict, attributes: Mapping | None) -> dict:
    if attributes:
        out["attributes"] = [{"key": key, "value": _value(value)} for key, value in attributes.items()]
    return out


def _value(value) -> dict:
    """An ``AnyValue``: one field of its ``oneof`` set, so present even at its default. The commonest
    types are told by ``type()`` first: ``isinstance`` against the ``Sequence`` ABC costs more than
    encoding the value (the SDK keeps a list attribute as a tuple)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is tuple or kind is list:
        return _array(value)
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Sequence):
        return _array(value)
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": [{"key": str(k), "value": _value(v)} for k, v in value.items()]}
                if value else {}}
    raise TypeError(f"an attribute value of type {type(value).__name__}: {value!r}")


def _array(values: Sequence) -> dict:
    """An ``ArrayValue``. The SDK keeps only arrays of one type (with ``None`` allowed), mostly ints and
    strings (token counts, block and request ids): those are encoded without a test or a call each."""
    if not values:
        return {"arrayValue": {}}
    kind = type(values[0])
    if kind is int and None not in values:
        encoded = [{"intValue": text} for text in map(str, values)]
    elif kind is str and None not in values:
        encoded = [{"stringValue": text} for text in values]
    else:
        encoded = [_value(v) for v in values]
    return {"arrayValue": {"values": encoded}}


def _double(value: float) -> float | str:
    """protobuf's JSON for a double: the number, or "NaN", "Infinity", "-Infinity"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value
