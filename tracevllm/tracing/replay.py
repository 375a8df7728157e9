"""Replay recorded traces: push ``--trace-out`` files to an OTLP receiver, or write them as one file.

A trace file (``file_exporter.py``) holds one OTLP ``ExportTraceServiceRequest`` per line in OTLP/JSON,
whose ids differ from protobuf's generic JSON mapping::

    OTLP/JSON (the file, and Jaeger's upload)      protobuf JSON (json_format)
    "traceId": "5b8efff798038103d269b633813fc60c"   "traceId": "W47/95gDgQPSabYzgT/GDA=="
    "spanId":  "eee19b7ec3c1b174"                   "spanId":  "7uGbfsPBsXQ="

Everything else is the same in both: camelCase names, enums as integers, 64-bit timestamps as decimal
strings. So ``from_otlp_json`` turns the ids to base64 before ``json_format.ParseDict`` and
``to_otlp_json`` turns them back to hex after ``MessageToDict`` (the files are written in hex in the
first place, ``otlp_json.py``).

Lines are replayed as they were recorded (one export request per line), so a receiver sees the same
batches, resources and scopes the engine's processes exported.

``tracevllm traces check`` holds a trace to the engine's invariants (``viz/check.py``); ``tracevllm traces
fit`` fits a step-cost model to its steps (``viz/step_cost.py``); ``tracevllm traces diff`` compares two
runs of one workload (``viz/diff.py``). ``tracevllm traces view`` serves the live page on a trace, its
events replayed as the engine sent them (``tracevllm/entrypoints/ui/view.py``).

``tracevllm traces jaeger`` writes one file: by default Jaeger's own JSON model (``jaeger.py``), which
the Jaeger UI opens with no backend; with ``--format otlp``, every line's ``resourceSpans`` merged into
one OTLP/JSON document (``to_otlp_document``), for Jaeger's ``/api/transform`` or other OTLP tools.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import sys

from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tracevllm.tracing.why import add_why_attributes
from tracevllm.whatif import SETTINGS as WHATIF_SETTINGS

PROTOCOLS = ("http/protobuf", "grpc")
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
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    send = _push_http if protocol == "http/protobuf" else _push_grpc
    send(requests, endpoint, headers or {}, timeout)
    return sum(count_spans(r) for r in requests)


def to_otlp_document(requests: list[ExportTraceServiceRequest]) -> dict:
    """All requests' resourceSpans as one OTLP/JSON document (one ``ExportTraceServiceRequest``)."""
    resource_spans: list[dict] = []
    for request in requests:
        resource_spans.extend(to_otlp_json(request).get("resourceSpans", []))
    return {"resourceSpans": resource_spans}


def _parse_headers(pairs: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--header must be KEY=VALUE, got {pair!r}")
        headers[key] = value
    return headers


def _push_command(args: argparse.Namespace) -> int:
    headers = _parse_headers(args.header)
    files = trace_files(args.paths)
    requests = load_export_requests(files)
    add_why_attributes(requests, args.paths)
    try:
        n = push(requests, args.endpoint, args.protocol, headers, args.timeout)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"pushed {n} spans from {len(files)} files to {args.endpoint}")
    return 0


def _jaeger_command(args: argparse.Namespace) -> int:
    from tracevllm.tracing.jaeger import to_jaeger_traces

    files = trace_files(args.paths)
    requests = load_export_requests(files)
    add_why_attributes(requests, args.paths)
    document = to_otlp_document(requests) if args.format == "otlp" else to_jaeger_traces(requests)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"), ensure_ascii=False)
    n = sum(count_spans(r) for r in requests)
    print(f"wrote {n} spans from {len(files)} files to {args.output}")
    return 0


def _explain_command(args: argparse.Namespace) -> int:
    from viz.explain import run  # viz reads traces without the engine: loaded only for this command

    return run(args)


def _fit_command(args: argparse.Namespace) -> int:
    from viz.step_cost import run  # numpy and the trace files only, loaded when the command runs

    return run(args)


def _whatif_command(args: argparse.Namespace) -> int:
    from tracevllm.whatif.command import run  # the scheduler and the trace files, no model: loaded when it runs

    return run(args)


def _check_command(args: argparse.Namespace) -> int:
    from viz.check import main as check  # viz loads when its command runs, as ``tracevllm viz`` does

    return check(args.path)


def _diff_command(args: argparse.Namespace) -> int:
    from viz.diff import run  # the trace files only (matplotlib for -o), loaded when the command runs

    return run(args)


def _view_command(args: argparse.Namespace) -> int:
    from tracevllm.entrypoints.ui.view import run  # the web server and viz load when the command runs

    return run(args)


def add_cli_args(traces: argparse.ArgumentParser) -> None:
    """``tracevllm traces push|jaeger|explain|fit|whatif|check|diff|view``, added to the ``traces`` command."""
    sub = traces.add_subparsers(dest="traces_command", required=True)

    push_parser = sub.add_parser("push", help="send trace files to an OTLP receiver (Jaeger, a collector)")
    push_parser.add_argument("paths", nargs="+", metavar="DIR", help="a --trace-out directory or .jsonl file")
    push_parser.add_argument("--endpoint", required=True,
                             help="e.g. http://localhost:4318 (http/protobuf) or localhost:4317 (grpc)")
    push_parser.add_argument("--protocol", choices=PROTOCOLS, default="http/protobuf",
                             help="OTLP transport (default: %(default)s)")
    push_parser.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                             help="an HTTP header or gRPC metadata entry (repeatable)")
    push_parser.add_argument("--timeout", type=float, default=10.0, help="seconds per export request (default: %(default)s)")
    push_parser.set_defaults(func=_push_command)

    jaeger = sub.add_parser("jaeger", help="write trace files as one JSON file for the Jaeger UI (or OTLP tools)")
    jaeger.add_argument("paths", nargs="+", metavar="DIR", help="a --trace-out directory or .jsonl file")
    jaeger.add_argument("-o", "--output", required=True, metavar="FILE")
    jaeger.add_argument("--format", choices=("jaeger", "otlp"), default="jaeger",
                        help="jaeger (default): Jaeger's own JSON model, which the Jaeger UI opens with "
                             "'Upload' tab with no backend running; otlp: one OTLP/JSON document, for "
                             "Jaeger's /api/transform or other OTLP tools")
    jaeger.set_defaults(func=_jaeger_command)

    explain = sub.add_parser("explain", help="why each request took as long as it did: every second charged "
                                             "to a cause (a step-level trace)")
    explain.add_argument("directory", metavar="DIR", help="a --trace-out directory")
    explain.add_argument("--request", metavar="ID", help="only this engine-core request id")
    explain.add_argument("--json", action="store_true",
                         help='print {"requests": [{"request_id", "e2e_s", "ttft_s", "parts", "blamed", "gaps"}]}')
    explain.set_defaults(func=_explain_command)

    fit = sub.add_parser("fit", help="fit a step-cost model to the engine steps (a step-level trace): its "
                                     "coefficients, R² and median error on held-out steps, and the spikes")
    fit.add_argument("directory", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    fit.add_argument("--json", action="store_true",
                     help='print {"features": [{"name", "unit", "coefficient"}], "r2", "median_relative_error", '
                          '"spikes", ...}')
    fit.set_defaults(func=_fit_command)

    whatif = sub.add_parser("whatif", help="replay a run through the real scheduler under another configuration, timed "
                                           "by a step-cost model fitted on its steps: the predicted trace, and both "
                                           "runs' figures")
    whatif.add_argument("directory", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    whatif.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help=f"change an engine option (repeatable): {', '.join(WHATIF_SETTINGS)}")
    whatif.add_argument("--arrival-scale", type=float, default=1.0, metavar="X",
                        help="X times the recorded arrival rate (default: %(default)s)")
    whatif.add_argument("--num-requests", type=int, metavar="N",
                        help="N requests drawn from the recorded ones, arriving at the recorded rate (default: as "
                             "recorded)")
    whatif.add_argument("--seed", type=int, default=0, help="for --num-requests (default: %(default)s)")
    whatif.add_argument("-o", "--output", required=True, metavar="OUT", help="a new directory for the predicted trace")
    whatif.add_argument("--trace-level", choices=("step", "request"), default="step",
                        help="of the predicted trace; request: no engine_step traces, for large workloads (default: "
                             "%(default)s)")
    whatif.add_argument("--json", action="store_true", help="print the changes and both runs' figures as JSON")
    whatif.set_defaults(func=_whatif_command)

    check = sub.add_parser("check", help="check the engine's invariants over a --trace-out directory (exit 1 "
                                         "on the first violation)")
    check.add_argument("path", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    check.set_defaults(func=_check_command)

    diff_help = ("compare two runs of one workload (real or predicted): the first step where their schedules part "
                 "and why, each request's TTFT and e2e in both")
    diff = sub.add_parser("diff", help=diff_help, description=diff_help[0].upper() + diff_help[1:] + ".")
    diff.add_argument("a", metavar="A", help="a --trace-out directory recorded at --trace-level step")
    diff.add_argument("b", metavar="B", help="another run of the same requests (the same ids and prompt lengths)")
    diff.add_argument("--json", action="store_true",
                      help='print {"a", "b", "schedules_compared", "num_steps_same", "divergence": {"step", '
                           '"start_a", "start_b", "differences"}, "requests", "summary", "picture"}')
    diff.add_argument("-o", "--output", metavar="PICTURE",
                      help="draw the two request timelines aligned (PNG, SVG or PDF, by the extension)")
    diff.set_defaults(func=_diff_command)

    view = sub.add_parser("view", help="serve the live page (/ui) on a recorded run, replayed at --speed")
    view.add_argument("directory", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    view.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    view.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    view.add_argument("--speed", default="1",
                      help="times the recorded pace, or 'max': as fast as the page reads (default: %(default)s)")
    view.add_argument("--jaeger-url", default=None, metavar="URL",
                      help="the Jaeger UI holding these traces (e.g. http://localhost:16686): the page links "
                           "each request to its trace there")
    view.set_defaults(func=_view_command)
