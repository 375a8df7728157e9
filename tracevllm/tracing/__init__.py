"""OpenTelemetry tracing: one span per stage of a request's life, and one trace per engine step.

Tracing is off unless a ``trace_out`` directory is given. Off, every component holds
``tracer = None`` (and every ``Request.span`` is None), so the hot path pays one ``is None`` check per
hook. On, spans go through a ``BatchSpanProcessor`` (exported off the hot path) to an OTLP JSON
Lines file (``file_exporter.py``). The span and attribute names are listed in ``docs/tracing.md``.
"""

from __future__ import annotations

import contextlib
import os

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tracevllm.tracing.file_exporter import JsonLinesSpanExporter

_propagator: TextMapPropagator = TraceContextTextMapPropagator()
_providers: dict[str, TracerProvider] = {}


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


def init_tracer(trace_out: str | None, service_name: str = "tracevllm") -> Tracer | None:
    """A tracer that writes to ``trace_out/<service_name>-<pid>.jsonl``, or None when tracing is off.

    One provider per (directory, process): calling it again returns a tracer of the same provider.
    """
    if trace_out is None:
        return None
    key = os.path.abspath(trace_out)
    provider = _providers.get(key)
    if provider is None:
        os.makedirs(key, exist_ok=True)
        path = os.path.join(key, f"{service_name}-{os.getpid()}.jsonl")
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(path)))
        _providers[key] = provider
    return provider.get_tracer("tracevllm")


def flush_traces() -> None:
    """Export every span ended so far (the files are complete when this returns)."""
    for provider in _providers.values():
        provider.force_flush()


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
