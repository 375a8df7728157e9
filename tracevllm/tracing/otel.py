"""OpenTelemetry set-up: one tracer provider per (output, service), exporters, and W3C propagation.

Spans go through ``BatchSpanProcessor``s (exported off the hot path) to an OTLP JSON Lines file
(``file_exporter.py``, one file per process, shared by the process's services) and/or live over
OTLP. Each process traces as one or two services (``schema.Service``): the front end as
``tracevllm`` and the engine core as ``tracevllm.engine_core``, under one ``service.namespace``; the
resource also names the process (``process.pid``, ``tracevllm.process``: MainProcess or EngineCore),
and a tracer's the trace format too (``tracevllm.trace_format``, ``schema.TRACE_FORMAT``: what a
reader may expect the spans to carry). The front end's metrics (``metrics/genai.py``) come from a
meter provider with the same resource, less the trace format.
This is the only module that configures OpenTelemetry; the observers beside it make the spans.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tracevllm.config import ObservabilityConfig
from tracevllm.tracing.file_exporter import JsonLinesSpanExporter
from tracevllm.tracing.schema import OTLP_PROTOCOLS, TRACE_FORMAT, Attr, Service

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
    from prometheus_client import CollectorRegistry

_propagator: TextMapPropagator = TraceContextTextMapPropagator()
_providers: dict[tuple[str | None, str | None, str], TracerProvider] = {}
_file_exporters: dict[str, JsonLinesSpanExporter] = {}
# The file exporters' processors: flush_traces() completes the files. Live OTLP exports are left to
# their own batching (a collector that is down must not stall generate()); the SDK flushes them when
# the process exits, except in a forked child, which runs no exit hook: flush_all_traces() then.
_file_processors: list[BatchSpanProcessor] = []


def _forget_parent_providers() -> None:
    """A forked process (an engine core or a worker) traces as itself: its own providers, whose
    resource names its pid and role, and its own file."""
    _providers.clear()
    _file_exporters.clear()
    _file_processors.clear()


os.register_at_fork(after_in_child=_forget_parent_providers)


def service_name(service: str) -> str:
    """``service`` (``schema.Service``), renamed by ``OTEL_SERVICE_NAME`` if set: the front end takes
    that name and the engine core that name plus ``.engine_core``."""
    base = os.environ.get("OTEL_SERVICE_NAME")
    if not base:
        return service
    return base + service.removeprefix(Service.FRONTEND)


def init_tracer(config: ObservabilityConfig, service: str) -> Tracer:
    """This process's tracer for ``service`` (``schema.Service``) under ``config`` (tracing on).

    Spans go to ``trace_out/tracevllm-<pid>.jsonl`` and/or live to ``otlp_traces_endpoint``. One
    provider per (config, service, process): calling again returns a tracer of the same provider.
    """
    key = (config.trace_out and os.path.abspath(config.trace_out), config.otlp_traces_endpoint, service)
    provider = _providers.get(key)
    if provider is None:
        provider = TracerProvider(resource=_resource(service, {Attr.TRACE_FORMAT: TRACE_FORMAT}))
        if config.trace_out is not None:
            processor = BatchSpanProcessor(_file_exporter(config.trace_out))
            provider.add_span_processor(processor)
            _file_processors.append(processor)
        if config.otlp_traces_endpoint is not None:
            provider.add_span_processor(BatchSpanProcessor(make_otlp_exporter(config.otlp_traces_endpoint)))
        _providers[key] = provider
    return provider.get_tracer("tracevllm")


def _resource(service: str, attributes: dict | None = None) -> Resource:
    return Resource.create({
        "service.name": service_name(service),
        "service.namespace": Service.NAMESPACE,
        "process.pid": os.getpid(),
        Attr.PROCESS: multiprocessing.current_process().name,
        **(attributes or {}),
    })


def make_meter_provider(registry: CollectorRegistry, otlp_metrics_endpoint: str | None) -> MeterProvider:
    """The front end's meter provider. Its metrics are read whenever ``registry`` is rendered (``GET
    /metrics``), and with ``otlp_metrics_endpoint`` also exported over OTLP, every
    ``OTEL_METRIC_EXPORT_INTERVAL`` ms (60,000 by default; the SDK reads the variable).

    The metrics SDK and the Prometheus reader are imported here, by the one process that meters: the
    engine core, a worker and ``traces whatif`` only trace, and start a tenth of a second sooner."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    readers: list[MetricReader] = [PrometheusMetricReader(registry=registry)]
    if otlp_metrics_endpoint is not None:
        readers.append(PeriodicExportingMetricReader(make_otlp_metric_exporter(otlp_metrics_endpoint)))
    return MeterProvider(metric_readers=readers, resource=_resource(Service.FRONTEND))


def _file_exporter(trace_out: str) -> JsonLinesSpanExporter:
    """One exporter per file, shared by this process's services (it writes whole lines under a lock)."""
    os.makedirs(trace_out, exist_ok=True)
    path = os.path.join(trace_out, f"tracevllm-{os.getpid()}.jsonl")
    if path not in _file_exporters:
        _file_exporters[path] = JsonLinesSpanExporter(path)
    return _file_exporters[path].share()


def make_otlp_exporter(endpoint: str) -> SpanExporter:
    """An OTLP span exporter to ``endpoint``, over ``_otlp_protocol("traces")``."""
    if _otlp_protocol("traces") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=_http_endpoint(endpoint, "traces"))


def make_otlp_metric_exporter(endpoint: str) -> MetricExporter:
    """An OTLP metric exporter to ``endpoint``, over ``_otlp_protocol("metrics")``."""
    if _otlp_protocol("metrics") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter(endpoint=_http_endpoint(endpoint, "metrics"))


def _otlp_protocol(signal: str) -> str:
    """The protocol the OpenTelemetry variables name for ``signal`` ("traces" or "metrics"):
    ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc`` (the
    default, as in vLLM) or ``http/protobuf``. Headers, timeouts, certificates: the SDK reads their
    ``OTEL_EXPORTER_OTLP_*`` variables itself."""
    protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
    if protocol not in OTLP_PROTOCOLS:
        raise ValueError(f"OTLP {signal} protocol must be 'grpc' or 'http/protobuf', got {protocol!r}.")
    return protocol


def _http_endpoint(endpoint: str, signal: str) -> str:
    """A bare collector address gets the signal's path (``/v1/traces``, ``/v1/metrics``)."""
    if urlparse(endpoint).path.rstrip("/"):
        return endpoint
    return endpoint.rstrip("/") + f"/v1/{signal}"


def flush_traces() -> None:
    """Write every span ended so far to the trace files (complete when this returns)."""
    for processor in _file_processors:
        processor.force_flush()


def flush_all_traces(timeout_s: float = 5.0) -> None:
    """Export every span ended so far, to the files and live, waiting up to ``timeout_s`` for a
    collector: for a process that exits without exit hooks (a forked engine core)."""
    for provider in _providers.values():
        provider.force_flush(int(timeout_s * 1000))


def inject_trace_headers(span: Span) -> dict[str, str]:
    """The W3C ``traceparent`` of ``span``, to carry in ``EngineCoreRequest.trace_headers``."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def extract_trace_context(headers: dict[str, str] | None) -> Context | None:
    return _propagator.extract(headers) if headers else None


def seconds_to_ns(timestamp: float) -> int:
    return int(timestamp * 1e9)
