"""An in-process OTLP receiver for tests: OTLP/HTTP and OTLP/gRPC on free 127.0.0.1 ports.

    with OtlpReceiver() as rx:
        exporter = OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces")  # or grpc_endpoint
        ...
        rx.wait_for(lambda rx: "llm_request" in rx.span_names())

Both endpoints append every accepted ``ExportTraceServiceRequest`` to one list, so a test reads the
same ``rx.requests`` / ``rx.spans()`` whatever protocol the sender used. HTTP takes
``application/x-protobuf`` and OTLP/JSON (``application/json``, hex ids), gzip or not. Setting
``rx.reject = True`` makes both refuse (HTTP 500, gRPC INTERNAL) and record nothing. Metrics
(``/v1/metrics``, protobuf) go to ``rx.metric_requests`` the same way.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from viz.export import from_otlp_json


def any_value(value: AnyValue) -> Any:
    """An OTLP attribute value as the Python value it was set from (lists for arrays)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def attributes(key_values: list[KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    receiver: OtlpReceiver


class _HttpHandler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:
        if self.path not in ("/v1/traces", "/v1/metrics"):
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        is_json = self.headers.get("Content-Type", "").startswith("application/json")
        if self.server.receiver.reject:
            self.send_error(500, "rejected by the test")
            return
        if self.path == "/v1/metrics":
            self.server.receiver._record_metrics(ExportMetricsServiceRequest.FromString(body))
            self._answer(False, ExportMetricsServiceResponse().SerializeToString())
            return
        try:
            request = from_otlp_json(json.loads(body)) if is_json else ExportTraceServiceRequest.FromString(body)
        except Exception as e:  # noqa: BLE001 - any undecodable body is the sender's fault
            self.send_error(400, str(e))
            return
        self.server.receiver._record(request)
        self._answer(is_json, b"{}" if is_json else ExportTraceServiceResponse().SerializeToString())

    def _answer(self, is_json: bool, answer: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if is_json else "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest's output clean


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: ExportTraceServiceRequest, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        if self.receiver.reject:
            context.abort(grpc.StatusCode.INTERNAL, "rejected by the test")
        self.receiver._record(request)
        return ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: ExportMetricsServiceRequest,
               context: grpc.ServicerContext) -> ExportMetricsServiceResponse:
        self.receiver._record_metrics(request)
        return ExportMetricsServiceResponse()


class OtlpReceiver:
    """Receives OTLP traces and metrics over HTTP and gRPC while inside its ``with`` block."""

    def __init__(self) -> None:
        self.reject = False
        self._lock = threading.Lock()
        self._requests: list[ExportTraceServiceRequest] = []
        self._metric_requests: list[ExportMetricsServiceRequest] = []
        self._http = _HttpServer(("127.0.0.1", 0), _HttpHandler)
        self._http.receiver = self
        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(self), self._grpc)
        grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self.http_endpoint = f"http://127.0.0.1:{self._http.server_address[1]}"
        self.grpc_endpoint = f"http://127.0.0.1:{grpc_port}"

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self._http.serve_forever, args=(0.05,), name="otlp-http", daemon=True).start()
        self._grpc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._grpc.stop(grace=None)
        self._http.shutdown()
        self._http.server_close()

    def _record(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _record_metrics(self, request: ExportMetricsServiceRequest) -> None:
        with self._lock:
            self._metric_requests.append(request)

    @property
    def metric_requests(self) -> list[ExportMetricsServiceRequest]:
        """The accepted metric export requests so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._metric_requests)

    @property
    def requests(self) -> list[ExportTraceServiceRequest]:
        """The accepted export requests so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every received span with its resource's attributes (e.g. ``service.name``)."""
        return [
            (attributes(rs.resource.attributes), span)
            for request in self.requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def span_names(self) -> list[str]:
        return [span.name for _, span in self.spans()]

    def wait_for(self, predicate: Callable[[OtlpReceiver], bool], timeout: float = 10.0) -> None:
        """Poll until ``predicate(self)`` holds; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"OTLP receiver: condition not met in {timeout}s; got {self.span_names()}")
            time.sleep(0.02)
