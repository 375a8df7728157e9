"""LLMEngine: the offline front end. Prompts in through the Processor, RequestOutputs out.

``add_request``: tokenize and validate (Processor) -> one EngineCoreRequest per sample (n > 1 fans
out) -> the engine core. ``step``: one engine-core step -> OutputProcessor -> RequestOutputs; the
requests a stop string finished are aborted in the core.
"""

from __future__ import annotations

from tracevllm.config import EngineArgs, VllmConfig
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.core_client import EngineCoreClient
from tracevllm.engine.output_processor import OutputProcessor, ParentRequest
from tracevllm.engine.processor import Processor, PromptType
from tracevllm.models.loader import get_tokenizer
from tracevllm.outputs import RequestOutput
from tracevllm.sampling_params import SamplingParams
from tracevllm.tracing import engine_core_request_attributes, init_tracer, stage_span


class LLMEngine:
    def __init__(self, vllm_config: VllmConfig, multiprocess_mode: bool = False) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.tokenizer = get_tokenizer(self.model_config.model)
        self.tracer = init_tracer(vllm_config.observability_config)
        self.processor = Processor(vllm_config, self.tokenizer, self.tracer)
        self.output_processor = OutputProcessor(
            self.tokenizer, self.tracer, vllm_config.observability_config.trace_include_text
        )
        self.engine_core = EngineCoreClient.make_client(multiprocess_mode, False, vllm_config)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, multiprocess_mode: bool = False) -> "LLMEngine":
        return cls(engine_args.create_engine_config(), multiprocess_mode)

    def shutdown(self) -> None:
        self.engine_core.shutdown()

    def get_tokenizer(self):
        return self.tokenizer

    def process_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
        add_special_tokens: bool = True,
    ) -> tuple[ParentRequest, list[EngineCoreRequest]]:
        """Validate and tokenize without queueing anything (raises ValueError on bad input)."""
        return self.processor.process_request(request_id, prompt, params, priority, add_special_tokens)

    def add_processed_request(self, parent: ParentRequest, requests: list[EngineCoreRequest]) -> None:
        for index, request in enumerate(requests):
            self.output_processor.add_request(request, parent, index)
            with stage_span(self.tracer, "EngineCoreRequest", parent.span, engine_core_request_attributes(request)):
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
