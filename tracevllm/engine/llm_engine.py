"""LLMEngine: the offline front end. Prompts in through the Processor, RequestOutputs out.

``add_request``: tokenize and validate (Processor) -> one EngineCoreRequest per sample (n > 1 fans
out) -> the engine core. ``step``: one engine-core step -> OutputProcessor -> RequestOutputs; the
requests a stop string finished are aborted in the core.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import Span

from tracevllm.config import EngineArgs, VllmConfig
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.core_client import EngineCoreClient
from tracevllm.engine.output_processor import OutputProcessor, ParentRequest
from tracevllm.engine.processor import Processor, PromptType
from tracevllm.models.loader import get_tokenizer
from tracevllm.outputs import RequestMetrics, RequestOutput
from tracevllm.sampling_params import SamplingParams
from tracevllm.tracing import SpanAttributes, init_tracer


class LLMEngine:
    def __init__(self, vllm_config: VllmConfig, multiprocess_mode: bool = False) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.tokenizer = get_tokenizer(self.model_config.model)
        self.tracer = init_tracer(vllm_config.observability_config.trace_out, "tracevllm")
        self.processor = Processor(vllm_config, self.tokenizer, self.tracer)
        self.output_processor = OutputProcessor(self.tokenizer, self.tracer, self.model_config.served_model_name)
        self.engine_core = EngineCoreClient.make_client(multiprocess_mode, False, vllm_config)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args.create_engine_config())

    def get_tokenizer(self):
        return self.tokenizer

    def process_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
        add_special_tokens: bool = True,
    ) -> tuple[ParentRequest, list[EngineCoreRequest]]:
        """Validate and tokenize without queueing anything (raises ValueError on bad input)."""
        arrival_time = time.time()
        span = self._start_request_span(request_id, params, arrival_time)
        try:
            prompt_text, request = self.processor.process_inputs(
                request_id, prompt, params, arrival_time, priority, parent_span=span,
                add_special_tokens=add_special_tokens,
            )
        except ValueError as e:
            if span is not None:
                span.record_exception(e)
                span.end()
            raise
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

    def add_processed_request(self, parent: ParentRequest, requests: list[EngineCoreRequest]) -> None:
        for index, request in enumerate(requests):
            self.output_processor.add_request(request, parent, index)
            if self.tracer is not None and parent.span is not None:
                with self.tracer.start_as_current_span(
                    "EngineCoreRequest", context=trace.set_span_in_context(parent.span)
                ) as span:
                    span.set_attributes({
                        "request.id": request.request_id,
                        "request.num_prompt_tokens": len(request.prompt_token_ids),
                    })
                    self.engine_core.add_request(request)
            else:
                self.engine_core.add_request(request)

    def add_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0
    ) -> None:
        if request_id in self.output_processor.parent_requests:
            raise ValueError(f"request_id {request_id!r} is already in use.")
        self.add_processed_request(*self.process_request(request_id, prompt, params, priority))

    def abort_request(self, request_ids: str | list[str]) -> None:
        request_ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self.engine_core.abort_requests(self.output_processor.abort_requests(request_ids))

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core.get_output()
        processed = self.output_processor.process_outputs(outputs.outputs)
        self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def _start_request_span(self, request_id: str, params: SamplingParams, arrival_time: float) -> Span | None:
        if self.tracer is None:
            return None
        return self.tracer.start_span(
            "llm_request",
            start_time=int(arrival_time * 1e9),
            attributes={
                SpanAttributes.GEN_AI_REQUEST_ID: request_id,
                SpanAttributes.GEN_AI_RESPONSE_MODEL: self.model_config.served_model_name,
                SpanAttributes.GEN_AI_REQUEST_MAX_TOKENS: params.max_tokens or 0,
                SpanAttributes.GEN_AI_REQUEST_TEMPERATURE: params.temperature,
                SpanAttributes.GEN_AI_REQUEST_TOP_P: params.top_p,
                SpanAttributes.GEN_AI_REQUEST_N: params.n,
            },
        )
