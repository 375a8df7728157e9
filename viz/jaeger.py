"""Recorded traces in Jaeger's own JSON model, the answer of Jaeger query's ``/api/traces``.

The Jaeger UI opens such a file by itself (the "Upload" tab of its search page), no
backend running. Spans are mapped as Jaeger maps OTLP: the OpenTelemetry Collector's translator
(opentelemetry-collector-contrib ``pkg/translator/jaeger/traces_to_jaegerproto.go``, which Jaeger
runs on the OTLP it receives), then Jaeger's model → JSON step (jaegertracing/jaeger
``model/converter/json/from_domain.go``)::

    OTLP                            Jaeger JSON
    span.trace_id, span_id          traceID (32 hex, 16 if the high half is zero), spanID (16 hex)
    span.parent_span_id             references[0]: CHILD_OF, in the span's own trace
    span.links                      further references: FOLLOWS_FROM, or CHILD_OF if the link's
                                    attribute opentracing.ref_type is "child_of"; no other
                                    link attribute is kept (a link to the parent only retypes it)
    span.flags bit 0 (sampled)      flags 1, else 0
    span.name                       operationName
    start, end (ns)                 startTime = start // 1000, duration = (end - start) // 1000 (us)
    scope name, version             tags otel.scope.name, otel.scope.version (if not empty), first
    span.attributes                 tags, in order, then:
    span.kind                       span.kind: server|client|producer|consumer|internal (none if unset)
    status.code OK / ERROR          otel.status_code: OK / ERROR; ERROR also error: true
    status.message                  otel.status_description (if not empty)
    span.trace_state                w3c.tracestate (if not empty)
    span.events                     logs: {timestamp (us), fields: event=<name>, then the attributes}
                                    (no event field if the name is empty or an attribute is "event")
    resource                        processes["pN"]: serviceName = service.name, tags = the others;
                                    a resource without attributes is "OTLPResourceNoServiceName"
    dropped_*_count                 nothing

Attribute values become typed tags: string → "string", bool → "bool", int → "int64" (a JSON number;
a string beyond ±(2**53 - 1), as Jaeger writes it), double → "float64", bytes → "binary" (base64),
array and map → "string" holding their JSON as Go's encoding/json writes it (compact, keys sorted).
Spans are grouped by trace id, in order of first appearance; within a trace, each distinct process
(service name and tags) gets ``p1``, ``p2``, ... in the order its first span appears.
"""

from __future__ import annotations

import base64
import json
import math
from decimal import Decimal

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

NO_SERVICE_NAME = "OTLPResourceNoServiceName"
_JS_MAX_SAFE_INTEGER = 2**53 - 1
_SPAN_KINDS = {Span.SPAN_KIND_SERVER: "server", Span.SPAN_KIND_CLIENT: "client",
               Span.SPAN_KIND_PRODUCER: "producer", Span.SPAN_KIND_CONSUMER: "consumer",
               Span.SPAN_KIND_INTERNAL: "internal"}
_STATUS_CODES = {Status.STATUS_CODE_OK: "OK", Status.STATUS_CODE_ERROR: "ERROR"}
# Go's encoding/json escapes these inside strings; Python's json leaves them as they are.
_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                             "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _trace_id(raw: bytes) -> str:
    n = int.from_bytes(raw, "big")
    return f"{n:032x}" if n >> 64 else f"{n:016x}"


def _span_id(raw: bytes) -> str:
    return f"{int.from_bytes(raw, 'big'):016x}"


def _go_float(f: float) -> str:
    """A float as Go's encoding/json writes it (ES6 number formatting); ValueError if not finite."""
    if not math.isfinite(f):
        raise ValueError(f"json: unsupported value: {f}")
    if f != 0 and not 1e-6 <= abs(f) < 1e21:
        mantissa, _, exponent = repr(f).partition("e")
        return f"{mantissa}e{exponent[0]}{exponent[1:].lstrip('0')}"  # 1e-07 -> 1e-7
    text = format(Decimal(repr(f)), "f")
    return text[:-2] if text.endswith(".0") else text


def _go_json(value: object) -> str:
    """``value`` (from ``_raw``) as compact JSON the way Go's json.Marshal writes it."""
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, list):
        return "[" + ",".join(_go_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_go_json(k)}:{_go_json(value[k])}" for k in sorted(value)) + "}"
    return json.dumps(value, ensure_ascii=False).translate(_GO_ESCAPES)


def _raw(value: AnyValue) -> object:
    """An AnyValue as a plain Python value, bytes as base64 (pdata's ``AsRaw`` before json.Marshal)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_raw(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _raw(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind) if kind else None


def _kv(key: str, type_: str, value: object) -> dict:
    return {"key": key, "type": type_, "value": value}


def _tag(key: str, value: AnyValue) -> dict:
    kind = value.WhichOneof("value")
    if kind == "bool_value":
        return _kv(key, "bool", value.bool_value)
    if kind == "int_value":
        n = value.int_value
        return _kv(key, "int64", n if abs(n) <= _JS_MAX_SAFE_INTEGER else str(n))
    if kind == "double_value":
        f = value.double_value  # NaN and infinities, which JSON cannot hold, as strings
        return _kv(key, "float64", f if math.isfinite(f) else str(f))
    if kind == "bytes_value":
        return _kv(key, "binary", base64.b64encode(value.bytes_value).decode("ascii"))
    if kind in ("array_value", "kvlist_value"):
        try:
            return _kv(key, "string", _go_json(_raw(value)))
        except ValueError:  # json.Marshal fails on NaN; the translator then keeps an empty string
            return _kv(key, "string", "")
    return _kv(key, "string", value.string_value)  # a string, or an empty value as ""


def _process(resource: Resource) -> dict:
    attributes = resource.attributes
    if not attributes:
        return {"serviceName": NO_SERVICE_NAME, "tags": []}
    service = next((a.value.string_value for a in attributes if a.key == "service.name"), "")
    return {"serviceName": service,
            "tags": [_tag(a.key, a.value) for a in attributes if a.key != "service.name"]}


def _references(span: Span, trace_id: str) -> list[dict]:
    parent = int.from_bytes(span.parent_span_id, "big")
    refs = [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": _span_id(span.parent_span_id)}] if parent else []
    for link in span.links:
        ref_type = next((a.value.string_value for a in link.attributes if a.key == "opentracing.ref_type"), None)
        ref = {"refType": "CHILD_OF" if ref_type == "child_of" else "FOLLOWS_FROM",
               "traceID": _trace_id(link.trace_id), "spanID": _span_id(link.span_id)}
        if parent and ref["traceID"] == trace_id and int.from_bytes(link.span_id, "big") == parent:
            refs[0]["refType"] = ref["refType"]  # a link to the parent only sets the parent's type
        else:
            refs.append(ref)
    return refs


def _tags(span: Span, scope: InstrumentationScope) -> list[dict]:
    tags = [_kv(key, "string", value) for key, value in
            (("otel.scope.name", scope.name), ("otel.scope.version", scope.version)) if value]
    tags += [_tag(a.key, a.value) for a in span.attributes]
    if span.kind in _SPAN_KINDS:
        tags.append(_kv("span.kind", "string", _SPAN_KINDS[span.kind]))
    if span.status.code in _STATUS_CODES:
        tags.append(_kv("otel.status_code", "string", _STATUS_CODES[span.status.code]))
    if span.status.code == Status.STATUS_CODE_ERROR:
        tags.append(_kv("error", "bool", True))
    if span.status.message:
        tags.append(_kv("otel.status_description", "string", span.status.message))
    if span.trace_state:
        tags.append(_kv("w3c.tracestate", "string", span.trace_state))
    return tags


def _logs(span: Span) -> list[dict]:
    logs = []
    for event in span.events:
        fields = []
        if event.name and not any(a.key == "event" for a in event.attributes):
            fields.append(_kv("event", "string", event.name))
        fields += [_tag(a.key, a.value) for a in event.attributes]
        logs.append({"timestamp": event.time_unix_nano // 1000, "fields": fields})
    return logs


def to_jaeger_traces(requests: list[ExportTraceServiceRequest]) -> dict:
    """Every span of ``requests`` as Jaeger's ``/api/traces`` response: one ``data`` entry per trace."""
    traces: dict[str, dict] = {}
    process_ids: dict[str, dict[str, str]] = {}  # per trace: the process as JSON -> "pN"
    for request in requests:
        for resource_spans in request.resource_spans:
            process = _process(resource_spans.resource)
            process_key = json.dumps(process, sort_keys=True)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    trace_id = _trace_id(span.trace_id)
                    trace = traces.setdefault(trace_id, {"traceID": trace_id, "spans": [], "processes": {},
                                                         "warnings": None})
                    ids = process_ids.setdefault(trace_id, {})
                    if process_key not in ids:
                        ids[process_key] = f"p{len(ids) + 1}"
                        trace["processes"][ids[process_key]] = process
                    trace["spans"].append({
                        "traceID": trace_id,
                        "spanID": _span_id(span.span_id),
                        "flags": span.flags & 1,  # the W3C sampled bit is Jaeger's SampledFlag
                        "operationName": span.name,
                        "references": _references(span, trace_id),
                        "startTime": span.start_time_unix_nano // 1000,
                        "duration": (span.end_time_unix_nano - span.start_time_unix_nano) // 1000,
                        "tags": _tags(span, scope_spans.scope),
                        "logs": _logs(span),
                        "processID": ids[process_key],
                        "warnings": None,
                    })
    return {"data": list(traces.values()), "total": 0, "limit": 0, "offset": 0, "errors": None}
