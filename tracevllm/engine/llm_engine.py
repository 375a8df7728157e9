"""LLMEngine: the offline front end. Prompts in through the Processor, RequestOutputs out.

``add_request``: tokenize and validate (Processor) -> one EngineCoreRequest per sample (n > 1 fans
out) -> the engine core. ``step``: one engine-core step -> OutputProcessor -> RequestOutputs; the
requests a stop string finished are stopped in the core. With tracing on, the request tracer is told
of each request added and of each request finished (``tracevllm/tracing/request_tracer.py``).
"""

from __future__ import annotations

import time

from tracevllm.config import VllmConfig
from tracevllm.engine import FinishReason
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.engine.core_client import EngineCoreClient
from tracevllm.engine.output_processor import OutputProcessor, ParentRequest
from tracevllm.engine.processor import ChildRequests, Processor, PromptType
from tracevllm.models.loader import get_tokenizer
from tracevllm.outputs import RequestOutput
from tracevllm.sampling_params import SamplingParams
from tracevllm.tracing import make_request_tracer, trace_startup
from tracevllm.tracing.schema import SpanName


class LLMEngine:
    """The offline engine: ``add_request`` turns a prompt into engine-core requests, each ``step()``
    runs one engine-core step and returns the ``RequestOutput``s it produced.

    ``startup_phases``: (name, start, end) of what ran before (``from_engine_args``: building the
    config), for the start-up trace."""

    def __init__(self, vllm_config: VllmConfig, multiprocess_mode: bool = False,
                 startup_phases: list[tuple[str, float, float]] | None = None) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        started = time.time()
        self.tokenizer = get_tokenizer(self.model_config.model)
        done = [*(startup_phases or []), (SpanName.LOAD_TOKENIZER, started, time.time())]
        self.request_tracer = make_request_tracer(
            vllm_config.observability_config, self.model_config.served_model_name, self.tokenizer
        )
        self.processor = Processor(vllm_config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        with trace_startup(self.request_tracer, done) as startup:
            with startup.phase(SpanName.START_ENGINE_CORE) as trace_headers:
                self.engine_core = EngineCoreClient.make_client(multiprocess_mode, False, vllm_config, trace_headers)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, multiprocess_mode: bool = False) -> "LLMEngine":
        started = time.time()
        vllm_config = engine_args.create_engine_config()
        return cls(vllm_config, multiprocess_mode, [(SpanName.CREATE_ENGINE_CONFIG, started, time.time())])

    def shutdown(self) -> None:
        self.engine_core.shutdown()

    def get_tokenizer(self):
        return self.tokenizer

    def process_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
        add_special_tokens: bool = True, messages: list[dict] | None = None,
    ) -> tuple[ParentRequest, ChildRequests]:
        """Validate and tokenize without queueing anything (raises ValueError on bad input).
        ``messages``: the conversation a chat prompt was rendered from."""
        return self.processor.process_request(request_id, prompt, params, priority, add_special_tokens,
                                              messages=messages)

    def add_processed_request(self, parent: ParentRequest, children: ChildRequests) -> None:
        requests = children[:]  # offline, the caller waits for all n samples: make them at once
        if self.request_tracer is not None:
            self.request_tracer.request_added(parent, requests, None)
        for index, request in enumerate(requests):
            self.output_processor.add_request(request, parent, index)
            self.engine_core.add_request(request)

    def add_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0
    ) -> None:
        if request_id in self.output_processor.parent_requests:
            raise ValueError(f"request_id {request_id!r} is already in use.")
        self.add_processed_request(*self.process_request(request_id, prompt, params, priority))

    def abort_request(self, request_ids: str | list[str]) -> None:
        request_ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        to_abort, aborted = self.output_processor.abort_requests(request_ids)
        self.engine_core.abort_requests(to_abort)
        if self.request_tracer is not None:
            self.request_tracer.requests_finished(aborted)

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core.get_output()
        processed = self.output_processor.process_outputs(outputs.outputs)
        self.engine_core.abort_requests(processed.reqs_to_abort, FinishReason.STOP)
        if self.request_tracer is not None:
            self.request_tracer.requests_finished(processed.finished_requests)
        return processed.request_outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()
