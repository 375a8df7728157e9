"""Recorded traces sent on: push ``--trace-out`` files to an OTLP receiver, or write them as one file.

A trace file (``tracevllm/tracing/file_exporter.py``) holds one OTLP ``ExportTraceServiceRequest`` per line in OTLP/JSON,
whose ids differ from protobuf's generic JSON mapping::

    OTLP/JSON (the file, and Jaeger's upload)      protobuf JSON (json_format)
    "traceId": "5b8efff798038103d269b633813fc60c"   "traceId": "W47/95gDgQPSabYzgT/GDA=="
    "spanId":  "eee19b7ec3c1b174"                   "spanId":  "7uGbfsPBsXQ="

Everything else is the same in both: camelCase names, enums as integers, 64-bit timestamps as decimal
strings. So ``from_otlp_json`` turns the ids to base64 before ``json_format.ParseDict`` and
``to_otlp_json`` turns them back to hex after ``MessageToDict`` (the files are written in hex in the
first place, ``tracevllm/tracing/otlp_json.py``).

Lines are sent as they were recorded (one export request per line), so a receiver sees the same
batches, resources and scopes the engine's processes exported.

``tracevllm traces push`` and ``tracevllm traces jaeger`` (``tracevllm/entrypoints/traces_cli.py``) read files with
``load_export_requests``; ``jaeger`` writes one file: by default Jaeger's own JSON model (``jaeger.py``),
which the Jaeger UI opens with no backend; with ``--format otlp``, every line's ``resourceSpans``
merged into one OTLP/JSON document (``to_otlp_document``), for Jaeger's ``/api/transform`` or other
OTLP tools.
"""

from __future__ import annotations

import base64
import copy
import json
import os

from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tracevllm.tracing.schema import OTLP_PROTOCOLS


ID_KEYS = ("traceId", "spanId", "parentSpanId")


def ids_to_hex(document: dict) -> None:
    """Turn the ids of an ``ExportTraceServiceRequest`` dict from protobuf's base64 (``MessageToDict``'s)
    into hex, in place. Ids sit on spans and on their links only, so only those are visited."""
    for resource_spans in document.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for holder in (span, *span.get("links", ())):
                    for key in ID_KEYS:
                        if key in holder:
                            holder[key] = base64.b64decode(holder[key]).hex()


def _ids_to_base64(obj: object) -> None:
    """The inverse of ``ids_to_hex``, in place."""
    if isinstance(obj, dict):
        for key in ID_KEYS:
            if key in obj:
                obj[key] = base64.b64encode(bytes.fromhex(obj[key])).decode("ascii")
        for value in obj.values():
            _ids_to_base64(value)
    elif isinstance(obj, list):
        for value in obj:
            _ids_to_base64(value)


def from_otlp_json(document: dict) -> ExportTraceServiceRequest:
    """An OTLP/JSON document (hex ids) as a protobuf message; ParseError/ValueError if it is not one."""
    if not isinstance(document, dict):
        raise ValueError(f"expected a JSON object, got {type(document).__name__}")
    document = copy.deepcopy(document)  # the id conversion works in place
    _ids_to_base64(document)
    return ParseDict(document, ExportTraceServiceRequest())


def to_otlp_json(request: ExportTraceServiceRequest) -> dict:
    """A protobuf message as an OTLP/JSON document: hex ids, integer enums, camelCase names."""
    document = MessageToDict(request, use_integers_for_enums=True)
    ids_to_hex(document)
    return document


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def trace_files(paths: list[str]) -> list[str]:
    """The files named by ``paths``: a file as given, a directory as its ``*.jsonl`` files, sorted."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".jsonl"))
            if not found:
                raise ValueError(f"no *.jsonl trace files in {path}")
            files.extend(found)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ValueError(f"no such trace file or directory: {path}")
    return files


def load_export_requests(paths: list[str]) -> list[ExportTraceServiceRequest]:
    """Every line of every trace file in ``paths`` (see ``trace_files``), in file and line order.

    Blank lines are skipped; any other line that is not an OTLP/JSON export request raises
    ValueError naming ``file:line``.
    """
    requests: list[ExportTraceServiceRequest] = []
    for path in trace_files(paths):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    requests.append(from_otlp_json(json.loads(line)))
                except (ValueError, TypeError, ParseError) as e:  # JSONDecodeError is a ValueError
                    raise ValueError(f"{path}:{lineno}: not an OTLP/JSON trace line: {e}") from e
    return requests


def _check_response(response: ExportTraceServiceResponse, where: str) -> None:
    rejected = response.partial_success.rejected_spans
    if rejected:
        raise RuntimeError(f"{where} rejected {rejected} spans: {response.partial_success.error_message}")


def _push_http(requests: list[ExportTraceServiceRequest], endpoint: str, headers: dict[str, str],
               timeout: float) -> None:
    import requests as http  # imported here so that `tracevllm --help` does not pay for it

    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    headers = {"Content-Type": "application/x-protobuf", **headers}
    for request in requests:
        try:
            answer = http.post(url, data=request.SerializeToString(), headers=headers, timeout=timeout)
        except http.RequestException as e:
            raise RuntimeError(f"could not send traces to {url}: {e}") from e
        content_type = answer.headers.get("Content-Type", "")
        if not 200 <= answer.status_code < 300:
            readable = content_type.startswith(("text/plain", "application/json"))  # not HTML or a binary Status
            body = " ".join(answer.text.split())[:200] if readable else ""
            raise RuntimeError(f"{url} answered HTTP {answer.status_code} {answer.reason} {body}".rstrip())
        if content_type.startswith("application/x-protobuf"):
            _check_response(ExportTraceServiceResponse.FromString(answer.content), url)


def _push_grpc(requests: list[ExportTraceServiceRequest], endpoint: str, headers: dict[str, str],
               timeout: float) -> None:
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    if endpoint.startswith("https://"):
        raise ValueError(f"grpc endpoint {endpoint}: TLS is not supported, give http://host:port")
    target = endpoint.removeprefix("http://").rstrip("/")
    metadata = [(key.lower(), value) for key, value in headers.items()]  # gRPC keys are lowercase
    with grpc.insecure_channel(target) as channel:
        stub = TraceServiceStub(channel)
        for request in requests:
            try:
                response = stub.Export(request, timeout=timeout, metadata=metadata)
            except grpc.RpcError as e:
                raise RuntimeError(f"{target} answered gRPC {e.code().name}: {e.details()}") from e
            _check_response(response, target)


def push(requests: list[ExportTraceServiceRequest], endpoint: str, protocol: str = "http/protobuf",
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> int:
    """Send each export request to an OTLP receiver; returns the number of spans sent.

    ``http/protobuf`` POSTs to ``{endpoint}/v1/traces`` (or to ``endpoint`` if it already ends so);
    ``grpc`` calls ``TraceService/Export`` on ``host:port`` (``http://`` allowed) without TLS. The
    first refused or failed request raises RuntimeError; those before it stay delivered.
    """
    if protocol not in OTLP_PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(OTLP_PROTOCOLS)}, got {protocol!r}")
    send = _push_http if protocol == "http/protobuf" else _push_grpc
    send(requests, endpoint, headers or {}, timeout)
    return sum(count_spans(r) for r in requests)


def to_otlp_document(requests: list[ExportTraceServiceRequest]) -> dict:
    """All requests' resourceSpans as one OTLP/JSON document (one ``ExportTraceServiceRequest``)."""
    resource_spans: list[dict] = []
    for request in requests:
        resource_spans.extend(to_otlp_json(request).get("resourceSpans", []))
    return {"resourceSpans": resource_spans}
