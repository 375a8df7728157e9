"""RequestTracer: the front end's spans (service ``tracevllm``), drawn from what the front end keeps.

Per request, ``request_added`` opens ``llm_request`` (from the request's arrival), draws ``tokenize``
(arrival until the ``EngineCoreRequest`` exists) and gives each ``EngineCoreRequest`` the trace
headers that make the engine core's ``scheduler.request`` its child. ``requests_finished`` closes
it from the request's ``RequestStateStats``: usage, latencies, finish reasons, then ``prefill``,
``decode`` and one ``detokenize`` span per sample, however many tokens it made::

    llm_request ─┬─ tokenize
                 ├─ scheduler.request       (engine core)
                 ├─ prefill ── decode
                 └─ detokenize              (counts and time spent, not a span per token)

``startup`` records the start-up trace's front-end half (``Overall Loading``).

The tracer completes this process's trace files when the start-up trace ends and whenever the last
open request closes (the front end is idle), so that a trace read right after ``LLM(...)`` or
``generate`` is whole; the engine core's tracers do the same on ``EngineIdle``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span

from tracevllm.config import ObservabilityConfig
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.output_processor import ParentRequest, RequestState
from tracevllm.tracing.otel import (
    extract_trace_context, flush_traces, init_tracer, inject_trace_headers, seconds_to_ns,
)
from tracevllm.tracing.schema import Attr, EventName, GenAI, GenAIValue, Service, SpanName, VllmAttr


class RequestTracer:
    def __init__(self, config: ObservabilityConfig, model_name: str, tokenizer,
                 clock: Callable[[], float] = time.time) -> None:
        self.tracer = init_tracer(config, Service.FRONTEND)
        self.clock = clock  # when a request's tokenizing ends: the wall clock, or a what-if replay's simulated one
        self.include_text = config.trace_include_text
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.spans: dict[str, Span] = {}

    # ---- start-up ------------------------------------------------------------------------------

    @contextmanager
    def startup(self, done: list[tuple[str, float, float]]) -> Iterator["_Startup"]:
        """``Overall Loading``, from the first of the phases ``done`` (name, start, end: those that
        ran before this tracer existed) until the ``with`` block ends; the block's phases follow."""
        started = min((start for _, start, _ in done), default=time.time())
        root = self.tracer.start_span(SpanName.OVERALL_LOADING, start_time=seconds_to_ns(started),
                                      attributes={Attr.MODEL: self.model_name})
        for name, start, end in done:
            self.tracer.start_span(name, context=trace.set_span_in_context(root),
                                   start_time=seconds_to_ns(start)).end(end_time=seconds_to_ns(end))
        try:
            yield _Startup(self, root)
        finally:
            root.end()
            flush_traces()

    # ---- requests ------------------------------------------------------------------------------

    def request_added(self, parent: ParentRequest, requests: list[EngineCoreRequest],
                      trace_headers: dict[str, str] | None) -> None:
        """Point each engine-core request's trace headers at ``llm_request``, which the first call
        for ``parent`` opens (a child of ``trace_headers``' span, else of the current span). AsyncLLM
        calls it once per chunk of samples it sends."""
        span = self.spans.get(parent.request_id)
        if span is None:
            span = self._open(parent, trace_headers)
        headers = inject_trace_headers(span)
        for request in requests:
            request.trace_headers = headers
            span.add_event(EventName.ENGINE_CORE_REQUEST, {Attr.REQUEST_ID: request.request_id},
                           timestamp=seconds_to_ns(self.clock()))

    def _open(self, parent: ParentRequest, trace_headers: dict[str, str] | None) -> Span:
        params = parent.params
        attributes = {
            GenAI.OPERATION_NAME: parent.operation_name,
            GenAI.PROVIDER_NAME: GenAIValue.PROVIDER,
            GenAI.REQUEST_MODEL: self.model_name,
            GenAI.RESPONSE_ID: parent.request_id,
            GenAI.REQUEST_MAX_TOKENS: params.max_tokens or 0,
            GenAI.REQUEST_TEMPERATURE: params.temperature,
            GenAI.REQUEST_TOP_P: params.top_p,
            GenAI.REQUEST_CHOICE_COUNT: params.n,
            VllmAttr.REQUEST_ID: parent.request_id,
            VllmAttr.REQUEST_N: params.n,
        }
        if params.top_k > 0:
            attributes[GenAI.REQUEST_TOP_K] = params.top_k
        if params.seed is not None:
            attributes[GenAI.REQUEST_SEED] = params.seed
        if self.include_text:
            attributes.update(self._input_messages(parent))
        span = self.tracer.start_span(SpanName.LLM_REQUEST, context=extract_trace_context(trace_headers),
                                      start_time=seconds_to_ns(parent.arrival_time), attributes=attributes)
        self.spans[parent.request_id] = span
        self.tracer.start_span(SpanName.TOKENIZE, context=trace.set_span_in_context(span),
                               start_time=seconds_to_ns(parent.arrival_time), attributes={
                                   Attr.NUM_PROMPT_TOKENS: len(parent.prompt_token_ids),
                                   Attr.PROMPT_TYPE: "token_ids" if parent.prompt is None else "text",
                               }).end(end_time=seconds_to_ns(self.clock()))
        return span

    def requests_finished(self, parents: list[ParentRequest]) -> None:
        """Close each request's ``llm_request``, its phases and its detokenize span; when none is
        left open, complete the trace files."""
        closed = False
        for parent in parents:
            span = self.spans.pop(parent.request_id, None)
            if span is not None:
                self._finish(parent, span)
                closed = True
        if closed and not self.spans:
            flush_traces()

    def _finish(self, parent: ParentRequest, span: Span) -> None:
        children = parent.children
        first = children[0].stats
        end = max((c.stats.finished_ts for c in children), default=0.0) or self.clock()
        num_prompt = len(parent.prompt_token_ids)
        num_output = sum(len(c.detokenizer.token_ids) for c in children)
        num_cached = children[0].num_cached_tokens if children else 0
        reasons = [str(c.finish_reason) for c in children]
        span.set_attributes({
            GenAI.RESPONSE_MODEL: self.model_name,
            GenAI.USAGE_INPUT_TOKENS: num_prompt, GenAI.USAGE_OUTPUT_TOKENS: num_output,
            GenAI.USAGE_CACHE_READ_INPUT_TOKENS: num_cached, GenAI.RESPONSE_FINISH_REASONS: reasons,
            VllmAttr.USAGE_PROMPT_TOKENS: num_prompt, VllmAttr.USAGE_COMPLETION_TOKENS: num_output,
            VllmAttr.USAGE_CACHED_TOKENS: num_cached,
            VllmAttr.LATENCY_TIME_IN_QUEUE: first.queued_time,
            VllmAttr.LATENCY_E2E: end - parent.arrival_time,
        })
        if first.first_token_ts:
            span.set_attributes({
                VllmAttr.LATENCY_TIME_TO_FIRST_TOKEN: first.first_token_latency,
                VllmAttr.LATENCY_TIME_IN_MODEL_PREFILL: first.prefill_time,
                VllmAttr.LATENCY_TIME_IN_MODEL_DECODE: first.decode_time,
                VllmAttr.LATENCY_TIME_IN_MODEL_INFERENCE: first.inference_time,
            })
        if self.include_text:
            span.set_attribute(GenAI.OUTPUT_MESSAGES, json.dumps([
                {"role": "assistant", "parts": [{"type": "text", "content": c.detokenizer.output_text}],
                 "finish_reason": str(c.finish_reason)} for c in children
            ], ensure_ascii=False))
        context = trace.set_span_in_context(span)
        for child in children:
            self._sample_spans(child, context, len(children) > 1)
        span.add_event(EventName.REQUEST_OUTPUT, {Attr.FINISH_REASON: reasons}, timestamp=seconds_to_ns(end))
        span.end(end_time=seconds_to_ns(end))

    def _sample_spans(self, child: RequestState, context, several: bool) -> None:
        """``prefill``, ``decode`` and ``detokenize`` of one sample, drawn from its stats: a phase
        only has both ends once it is over."""
        s = child.stats
        ids = {Attr.REQUEST_ID: child.request_id} if several else {}
        phases = [(SpanName.PREFILL, s.scheduled_ts, s.first_token_ts, {}),
                  (SpanName.DECODE, s.first_token_ts, s.last_token_ts,
                   {Attr.NUM_OUTPUT_TOKENS: s.num_generation_tokens, Attr.NUM_PREEMPTIONS: s.num_preemptions}),
                  (SpanName.DETOKENIZE, s.first_token_ts, s.last_token_ts,
                   {Attr.DETOKENIZE_NUM_TOKENS: s.num_generation_tokens, Attr.DETOKENIZE_TIME: s.detokenize_time})]
        for name, start, end, attributes in phases:
            if start and end:
                self.tracer.start_span(name, context=context, start_time=seconds_to_ns(start),
                                       attributes={**ids, **attributes}).end(end_time=seconds_to_ns(end))

    def _input_messages(self, parent: ParentRequest) -> dict[str, str]:
        """The conversation in the GenAI conventions' parts form; system messages apart."""
        if parent.messages is None:
            text = parent.prompt if parent.prompt is not None else self.tokenizer.decode(parent.prompt_token_ids)
            return {GenAI.INPUT_MESSAGES: json.dumps([{"role": "user", "parts": [_text_part(text)]}],
                                                      ensure_ascii=False)}
        system = [part for m in parent.messages if m.get("role") == "system" for part in _parts(m.get("content"))]
        messages = [{"role": m.get("role"), "parts": _parts(m.get("content"))}
                    for m in parent.messages if m.get("role") != "system"]
        attributes = {GenAI.INPUT_MESSAGES: json.dumps(messages, ensure_ascii=False)}
        if system:
            attributes[GenAI.SYSTEM_INSTRUCTIONS] = json.dumps(system, ensure_ascii=False)
        return attributes


def _text_part(text: str) -> dict:
    return {"type": "text", "content": text}


def _parts(content) -> list[dict]:
    """A message's content (a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts)."""
    if isinstance(content, str):
        return [_text_part(content)]
    return [_text_part(p.get("text", "")) for p in content or [] if isinstance(p, dict) and p.get("type") == "text"]


class _Startup:
    """The phases of the front end's start-up, each a live child span of ``Overall Loading``."""

    def __init__(self, tracer: RequestTracer, root: Span) -> None:
        self.tracer, self.root = tracer.tracer, root

    @contextmanager
    def phase(self, name: str) -> Iterator[dict[str, str]]:
        """Yields the phase's trace headers (for a child span in another process)."""
        with self.tracer.start_as_current_span(name, context=trace.set_span_in_context(self.root)) as span:
            yield inject_trace_headers(span)
