"""Processor: a user's prompt and sampling parameters in, validated EngineCoreRequests out.

Shared by both front ends (LLMEngine and AsyncLLM): ``process_request`` starts the request's root
span, tokenizes and validates (``process_inputs``), and fans a request with ``n > 1`` out into n
engine-core requests ``"{i}_{request_id}"`` (seeds ``seed + i``) under one ``ParentRequest``.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import Span, Tracer

from tracevllm.config import VllmConfig
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.output_processor import ParentRequest
from tracevllm.outputs import RequestMetrics
from tracevllm.sampling_params import SamplingParams
from tracevllm.tracing import SpanAttributes, extract_trace_context, inject_trace_headers

PromptType = str | list[int]


class Processor:
    def __init__(self, vllm_config: VllmConfig, tokenizer, tracer: Tracer | None = None) -> None:
        self.max_model_len = vllm_config.model_config.max_model_len
        self.model_name = vllm_config.model_config.served_model_name
        self.trace_include_text = vllm_config.observability_config.trace_include_text
        self.vocab_size = vllm_config.model_config.vocab_size
        self.tokenizer = tokenizer
        self.tracer = tracer

    def process_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
        add_special_tokens: bool = True, trace_headers: dict[str, str] | None = None,
    ) -> tuple[ParentRequest, list[EngineCoreRequest]]:
        """Validate and tokenize without queueing anything (raises ValueError on bad input).

        ``trace_headers`` (W3C ``traceparent``): the request's ``llm_request`` span becomes a child
        of that span (the server's HTTP span); without it, of the caller's current span, if any.
        """
        arrival_time = time.time()
        span = self._start_request_span(request_id, params, arrival_time, trace_headers)
        try:
            prompt_text, request = self.process_inputs(
                request_id, prompt, params, arrival_time, priority, parent_span=span,
                add_special_tokens=add_special_tokens,
            )
        except ValueError as e:
            if span is not None:
                span.record_exception(e)
                span.end()
            raise
        if span is not None and self.trace_include_text:
            text = prompt_text if prompt_text is not None else self.tokenizer.decode(request.prompt_token_ids)
            span.set_attribute(SpanAttributes.GEN_AI_PROMPT, text)
        parent = ParentRequest(
            request_id, prompt_text, request.prompt_token_ids, request.sampling_params,
            RequestMetrics(arrival_time=arrival_time), span,
        )
        if params.n == 1:
            return parent, [request]
        children = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            child_params = request.sampling_params.clone(n=1, seed=seed)
            children.append(
                EngineCoreRequest(
                    f"{i}_{request_id}", request.prompt_token_ids, child_params, request.eos_token_id,
                    arrival_time, priority, request.trace_headers,
                )
            )
        return parent, children

    def process_inputs(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        parent_span: Span | None = None,
        add_special_tokens: bool = True,
    ) -> tuple[str | None, EngineCoreRequest]:
        """Tokenize and validate. Returns the prompt text (None for token-id prompts) and the request.

        ``params.max_tokens`` of None becomes "up to max_model_len". ``add_special_tokens=False`` for
        text that already has them (a rendered chat template starts with its own BOS). Raises
        ValueError on bad input.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}.")
        arrival_time = time.time() if arrival_time is None else arrival_time
        prompt_text, prompt_token_ids = self._tokenize(prompt, parent_span, add_special_tokens)
        self._validate_prompt(prompt_token_ids)
        if params.max_tokens is None:
            params = params.clone(max_tokens=self.max_model_len - len(prompt_token_ids))
        trace_headers = inject_trace_headers(parent_span) if parent_span is not None else None
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_id=self.tokenizer.eos_token_id,
            arrival_time=arrival_time,
            priority=priority,
            trace_headers=trace_headers,
        )
        return prompt_text, request

    def _tokenize(self, prompt: PromptType, parent_span: Span | None,
                  add_special_tokens: bool) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tracer is None or parent_span is None:
                return prompt, self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
            with self.tracer.start_as_current_span("tokenize", context=trace.set_span_in_context(parent_span)) as span:
                token_ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
                span.set_attribute("request.num_prompt_tokens", len(token_ids))
            return prompt, token_ids
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError("prompt must be a string or a list of token ids (ints).")

    def _validate_prompt(self, prompt_token_ids: list[int]) -> None:
        if not prompt_token_ids:
            raise ValueError("The prompt is empty: it must have at least one token.")
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            raise ValueError(f"Prompt token ids must be in [0, {self.vocab_size}).")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt is {len(prompt_token_ids)} tokens long, which leaves no room to generate "
                f"within max_model_len ({self.max_model_len}); the prompt must be shorter than max_model_len."
            )

    def _start_request_span(self, request_id: str, params: SamplingParams, arrival_time: float,
                            trace_headers: dict[str, str] | None) -> Span | None:
        if self.tracer is None:
            return None
        return self.tracer.start_span(
            "llm_request",
            context=extract_trace_context(trace_headers),
            start_time=int(arrival_time * 1e9),
            attributes={
                SpanAttributes.GEN_AI_REQUEST_ID: request_id,
                SpanAttributes.GEN_AI_RESPONSE_MODEL: self.model_name,
                SpanAttributes.GEN_AI_REQUEST_MAX_TOKENS: params.max_tokens or 0,
                SpanAttributes.GEN_AI_REQUEST_TEMPERATURE: params.temperature,
                SpanAttributes.GEN_AI_REQUEST_TOP_P: params.top_p,
                SpanAttributes.GEN_AI_REQUEST_N: params.n,
            },
        )
