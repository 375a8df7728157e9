"""OpenTelemetry tracing: one span per stage of a request's life, and one trace per engine step.

Tracing is off unless a ``trace_out`` directory or an ``otlp_traces_endpoint`` is given. Off, every
component holds ``tracer = None`` (and every ``Request.span`` is None), so the hot path pays one
``is None`` check per hook. On, spans go through ``BatchSpanProcessor``s (exported off the hot path)
to an OTLP JSON Lines file (``file_exporter.py``) and/or live over OTLP; ``replay.py`` pushes
recorded files to a collector later. The span and attribute names are listed in ``docs/tracing.md``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
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

_propagator: TextMapPropagator = TraceContextTextMapPropagator()
_providers: dict[tuple[str | None, str | None], TracerProvider] = {}
# The file exporters' processors: flush_traces() completes the files. Live OTLP exports are left to
# their own batching (a collector that is down must not stall generate()); the SDK flushes them when
# the process exits.
_file_processors: list[BatchSpanProcessor] = []


class SpanAttributes:
    """Attribute names. ``gen_ai.*`` are the names vLLM's ``llm_request`` span uses."""

    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_USAGE_CACHED_TOKENS = "gen_ai.usage.cached_tokens"
    GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    # Only with trace_include_text (tracevllm's, in the gen_ai namespace).
    GEN_AI_PROMPT = "gen_ai.prompt"
    GEN_AI_COMPLETION = "gen_ai.completion"


def init_tracer(config: ObservabilityConfig) -> Tracer | None:
    """This process's tracer for ``config``, or None when tracing is off.

    Spans go to ``trace_out/tracevllm-<pid>.jsonl`` and/or live to ``otlp_traces_endpoint``, through
    one ``BatchSpanProcessor`` each. One provider per (config, process): calling again returns a
    tracer of the same provider. The resource is ``service.name`` "tracevllm" (or
    ``OTEL_SERVICE_NAME``), ``process.pid`` and ``tracevllm.process`` ("MainProcess" or "EngineCore").
    """
    if not config.tracing_enabled:
        return None
    key = (config.trace_out and os.path.abspath(config.trace_out), config.otlp_traces_endpoint)
    provider = _providers.get(key)
    if provider is None:
        attributes = {"process.pid": os.getpid(), "tracevllm.process": multiprocessing.current_process().name}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "tracevllm"
        provider = TracerProvider(resource=Resource.create(attributes))
        if config.trace_out is not None:
            os.makedirs(config.trace_out, exist_ok=True)
            path = os.path.join(config.trace_out, f"tracevllm-{os.getpid()}.jsonl")
            processor = BatchSpanProcessor(JsonLinesSpanExporter(path))
            provider.add_span_processor(processor)
            _file_processors.append(processor)
        if config.otlp_traces_endpoint is not None:
            provider.add_span_processor(BatchSpanProcessor(make_otlp_exporter(config.otlp_traces_endpoint)))
        _providers[key] = provider
    return provider.get_tracer("tracevllm")


def make_otlp_exporter(endpoint: str) -> SpanExporter:
    """An OTLP exporter to ``endpoint`` over the protocol the OpenTelemetry variables name
    (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``): ``grpc`` (the
    default, as in vLLM) or ``http/protobuf``. Headers, timeouts, certificates: the SDK reads their
    ``OTEL_EXPORTER_OTLP_*`` variables itself."""
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        if not urlparse(endpoint).path.rstrip("/"):  # a bare collector address: the traces path is implied
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        return HttpExporter(endpoint=endpoint)
    raise ValueError(f"OTLP traces protocol must be 'grpc' or 'http/protobuf', got {protocol!r}.")


def flush_traces() -> None:
    """Write every span ended so far to the trace files (complete when this returns)."""
    for processor in _file_processors:
        processor.force_flush()


def inject_trace_headers(span: Span) -> dict[str, str]:
    """The W3C ``traceparent`` of ``span``, to carry in ``EngineCoreRequest.trace_headers``."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def extract_trace_context(headers: dict[str, str] | None) -> Context | None:
    return _propagator.extract(headers) if headers else None


def stage_span(tracer: Tracer | None, name: str, parent: Span | None, attributes: dict) -> contextlib.AbstractContextManager:
    """A child span of a request's root span around one stage, or nothing when tracing is off."""
    if tracer is None or parent is None:
        return contextlib.nullcontext()
    return tracer.start_as_current_span(name, context=trace.set_span_in_context(parent), attributes=attributes)


def engine_core_request_attributes(request) -> dict:
    return {"request.id": request.request_id, "request.num_prompt_tokens": len(request.prompt_token_ids)}
