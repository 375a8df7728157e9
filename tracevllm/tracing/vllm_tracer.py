"""The tracer of a vLLM run (``VllmTracer``), and the ``llm_request`` span of each of its requests:
what vLLM's front end would say of it.

tracevllm's front end draws a request's ``llm_request`` (``tracing/request_tracer.py``) from the stats
it keeps; in a vLLM run the recorder sits in vLLM's engine core, where the front end's stats are not.
What the lenses read of ``llm_request`` is known there too: the request's arrival (vLLM stamps
``Request.arrival_time`` in its front end, on the same wall clock), the step whose output carried its
first token, and the one that finished it. So this tracer opens the span at the arrival, as the parent
of the engine core's ``scheduler.request``, and closes it with vLLM's latency attributes
(``schema.VllmAttr``). The times are the engine core's: the detokenizing and the hand-back to the
caller that follow a step are not in them.

The ``TracingScheduler`` tells it what happened in four typed messages (``LlmRequestMessage``), sent
beside the recorder's events, to wherever ``VllmTracer`` runs (``vllm/recording.py``): in vLLM's
engine core, or in a process of its own (``observer_process.py``). So the engine core, which must name
a request's trace at once (``RequestQueued.trace_headers``, the live page's snapshots), chooses the
span's ids itself (``new_trace_headers``), and the span is made with them. Nothing here imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Span

from tracevllm.config import ObservabilityConfig
from tracevllm.core.events import EngineEvent
from tracevllm.tracing.engine_tracer import EngineCoreTracer
from tracevllm.tracing.otel import init_tracer, seconds_to_ns
from tracevllm.tracing.schema import Attr, GenAI, Service, SpanName, VllmAttr


_RANDOM_IDS = RandomIdGenerator()


def new_trace_headers() -> dict[str, str]:
    """The W3C ``traceparent`` of a request's ``llm_request`` span, chosen before the span is made."""
    return {"traceparent": f"00-{_RANDOM_IDS.generate_trace_id():032x}-{_RANDOM_IDS.generate_span_id():016x}-01"}


class LlmRequestArrived(msgspec.Struct, tag=True, array_like=True):
    """vLLM's front end stamped the request (``arrival_time``); its scheduler queued it (``queued_time``);
    its ``llm_request`` span is to have the ids of ``trace_headers`` (``new_trace_headers``)."""

    request_id: str
    arrival_time: float
    queued_time: float
    num_prompt_tokens: int
    max_tokens: int
    trace_headers: dict[str, str]


class LlmRequestScheduled(msgspec.Struct, tag=True, array_like=True):
    """Admitted (only the first admission counts)."""

    request_id: str
    timestamp: float


class LlmRequestFirstToken(msgspec.Struct, tag=True, array_like=True):
    """The step that ended at ``timestamp`` gave the request its first output token."""

    request_id: str
    timestamp: float


class LlmRequestFinished(msgspec.Struct, tag=True, array_like=True):
    request_id: str
    timestamp: float
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int


LlmRequestMessage = LlmRequestArrived | LlmRequestScheduled | LlmRequestFirstToken | LlmRequestFinished


@dataclass
class _OpenRequest:
    span: Span
    arrival_time: float
    queued_time: float
    scheduled_time: float | None = None
    first_token_time: float | None = None


class _GivenIds(IdGenerator):
    """The ids chosen for the next span (``given``, then cleared); random ones otherwise."""

    def __init__(self) -> None:
        self.given: tuple[int, int] | None = None

    def generate_trace_id(self) -> int:
        return _RANDOM_IDS.generate_trace_id() if self.given is None else self.given[0]

    def generate_span_id(self) -> int:
        if self.given is None:
            return _RANDOM_IDS.generate_span_id()
        span_id, self.given = self.given[1], None
        return span_id


class VllmRequestSpans:
    def __init__(self, config: ObservabilityConfig, model_name: str) -> None:
        self.tracer = init_tracer(config, Service.FRONTEND)
        self.ids = self.tracer.id_generator = _GivenIds()  # this tracer's alone (the SDK makes one per call)
        self.model_name = model_name
        self.open: dict[str, _OpenRequest] = {}
        self.handlers = {LlmRequestArrived: self.arrived, LlmRequestScheduled: self.scheduled,
                         LlmRequestFirstToken: self.first_token, LlmRequestFinished: self.finished}

    def on_message(self, message: LlmRequestMessage) -> None:
        self.handlers[type(message)](message)

    def arrived(self, m: LlmRequestArrived) -> None:
        """Open the request's span at its arrival, with the ids of ``m.trace_headers``."""
        _, trace_id, span_id, _ = m.trace_headers["traceparent"].split("-")
        self.ids.given = int(trace_id, 16), int(span_id, 16)
        span = self.tracer.start_span(SpanName.LLM_REQUEST, start_time=seconds_to_ns(m.arrival_time), attributes={
            GenAI.REQUEST_MODEL: self.model_name, GenAI.REQUEST_MAX_TOKENS: m.max_tokens,
            VllmAttr.REQUEST_ID: m.request_id, VllmAttr.REQUEST_N: 1, Attr.NUM_PROMPT_TOKENS: m.num_prompt_tokens,
        })
        self.open[m.request_id] = _OpenRequest(span, m.arrival_time, m.queued_time)

    def scheduled(self, m: LlmRequestScheduled) -> None:
        request = self.open.get(m.request_id)
        if request is not None and request.scheduled_time is None:
            request.scheduled_time = m.timestamp

    def first_token(self, m: LlmRequestFirstToken) -> None:
        request = self.open.get(m.request_id)
        if request is not None and request.first_token_time is None:
            request.first_token_time = m.timestamp

    def finished(self, m: LlmRequestFinished) -> None:
        """Close the span with vLLM's latency attributes (those of a phase that never began are left out)."""
        request = self.open.pop(m.request_id, None)
        if request is None:
            return
        now, num_prompt_tokens, num_output_tokens = m.timestamp, m.num_prompt_tokens, m.num_output_tokens
        num_cached_tokens = m.num_cached_tokens
        attributes = {
            GenAI.RESPONSE_MODEL: self.model_name, GenAI.RESPONSE_FINISH_REASONS: [m.finish_reason],
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


class VllmTracer:
    """The recording's observers: tracevllm's engine tracer, hearing the recorder's events, and the
    ``llm_request`` spans, told the ``LlmRequestMessage``s."""

    def __init__(self, trace_dir: str, model: str) -> None:
        config = ObservabilityConfig(trace_out=trace_dir, trace_level="step")
        self.engine_tracer = EngineCoreTracer(config)
        self.request_spans = VllmRequestSpans(config, model)

    def on_event(self, event: EngineEvent | LlmRequestMessage) -> None:
        if type(event) in self.request_spans.handlers:
            self.request_spans.on_message(event)
            return
        self.engine_tracer.on_event(event)

    def close(self) -> None:
        """Nothing to wait for: the engine tracer's ``EngineIdle(shutdown=True)`` wrote every span."""
