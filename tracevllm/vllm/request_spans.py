"""The ``llm_request`` span of each request in a vLLM run: what vLLM's front end would say of it.

tracevllm's front end draws a request's ``llm_request`` (``tracing/request_tracer.py``) from the stats
it keeps; in a vLLM run the recorder sits in vLLM's engine core, where the front end's stats are not.
What the lenses read of ``llm_request`` is known there too: the request's arrival (vLLM stamps
``Request.arrival_time`` in its front end, on the same wall clock), the step whose output carried its
first token, and the one that finished it. So this tracer opens the span at the arrival, as the parent
of the engine core's ``scheduler.request``, and closes it with vLLM's latency attributes
(``schema.VllmAttr``). The times are the engine core's: the detokenizing and the hand-back to the
caller that follow a step are not in them.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import Span

from tracevllm.config import ObservabilityConfig
from tracevllm.tracing.otel import init_tracer, inject_trace_headers, seconds_to_ns
from tracevllm.tracing.schema import Attr, GenAI, Service, SpanName, VllmAttr


@dataclass
class _OpenRequest:
    span: Span
    arrival_time: float
    queued_time: float
    scheduled_time: float | None = None
    first_token_time: float | None = None


class VllmRequestSpans:
    def __init__(self, config: ObservabilityConfig, model_name: str) -> None:
        self.tracer = init_tracer(config, Service.FRONTEND)
        self.model_name = model_name
        self.open: dict[str, _OpenRequest] = {}

    def arrived(self, request_id: str, arrival_time: float, queued_time: float, num_prompt_tokens: int,
                max_tokens: int) -> dict[str, str]:
        """Open the request's span at its arrival; returns its trace headers, for ``scheduler.request``."""
        span = self.tracer.start_span(SpanName.LLM_REQUEST, start_time=seconds_to_ns(arrival_time), attributes={
            GenAI.REQUEST_MODEL: self.model_name, GenAI.REQUEST_MAX_TOKENS: max_tokens,
            VllmAttr.REQUEST_ID: request_id, VllmAttr.REQUEST_N: 1, Attr.NUM_PROMPT_TOKENS: num_prompt_tokens,
        })
        self.open[request_id] = _OpenRequest(span, arrival_time, queued_time)
        return inject_trace_headers(span)

    def trace_headers(self, request_id: str) -> dict[str, str] | None:
        """The open span's trace headers (those ``arrived`` returned); None once it is closed."""
        request = self.open.get(request_id)
        return None if request is None else inject_trace_headers(request.span)

    def scheduled(self, request_id: str, now: float) -> None:
        request = self.open.get(request_id)
        if request is not None and request.scheduled_time is None:
            request.scheduled_time = now

    def first_token(self, request_id: str, now: float) -> None:
        request = self.open.get(request_id)
        if request is not None and request.first_token_time is None:
            request.first_token_time = now

    def finished(self, request_id: str, now: float, finish_reason: str, num_prompt_tokens: int,
                 num_output_tokens: int, num_cached_tokens: int) -> None:
        """Close the span with vLLM's latency attributes (those of a phase that never began are left out)."""
        request = self.open.pop(request_id, None)
        if request is None:
            return
        attributes = {
            GenAI.RESPONSE_MODEL: self.model_name, GenAI.RESPONSE_FINISH_REASONS: [finish_reason],
            GenAI.USAGE_INPUT_TOKENS: num_prompt_tokens, GenAI.USAGE_OUTPUT_TOKENS: num_output_tokens,
            GenAI.USAGE_CACHE_READ_INPUT_TOKENS: num_cached_tokens,
            VllmAttr.USAGE_PROMPT_TOKENS: num_prompt_tokens, VllmAttr.USAGE_COMPLETION_TOKENS: num_output_tokens,
            VllmAttr.USAGE_CACHED_TOKENS: num_cached_tokens, VllmAttr.LATENCY_E2E: now - request.arrival_time,
        }
        if request.scheduled_time is not None:
            attributes[VllmAttr.LATENCY_TIME_IN_QUEUE] = request.scheduled_time - request.queued_time
            attributes[VllmAttr.LATENCY_TIME_IN_MODEL_INFERENCE] = now - request.scheduled_time
        if request.first_token_time is not None and request.scheduled_time is not None:
            attributes.update({
                VllmAttr.LATENCY_TIME_TO_FIRST_TOKEN: request.first_token_time - request.arrival_time,
                VllmAttr.LATENCY_TIME_IN_MODEL_PREFILL: request.first_token_time - request.scheduled_time,
                VllmAttr.LATENCY_TIME_IN_MODEL_DECODE: now - request.first_token_time,
            })
        request.span.set_attributes(attributes)
        request.span.end(end_time=seconds_to_ns(now))
