"""EngineCore: the scheduler and the model executor, stepped together.

``step()`` is the engine's heartbeat: ``schedule -> execute_model -> sample_tokens ->
update_from_output``. The front end (LLMEngine / AsyncLLM) talks to it only through
``EngineCoreRequest`` in and ``EngineCoreOutputs`` out, so the same class can run in the caller's
process (InprocClient) or in a background process.
"""

from __future__ import annotations

import time

from opentelemetry import trace

from tracevllm.config import VllmConfig
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.engine import EngineCoreOutputs, EngineCoreRequest
from tracevllm.executor.uniproc_executor import UniProcExecutor
from tracevllm.request import Request, RequestStatus
from tracevllm.tracing import init_tracer


class EngineCore:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_executor = UniProcExecutor(vllm_config)
        num_blocks = self._initialize_kv_caches()
        self.tracer = init_tracer(vllm_config.observability_config.trace_out, "tracevllm")
        self.scheduler = Scheduler(vllm_config.scheduler_config, vllm_config.cache_config, self.tracer)
        self.num_gpu_blocks = num_blocks
        self.step_counter = 0

    def _initialize_kv_caches(self) -> int:
        cache_config = self.vllm_config.cache_config
        num_blocks = self.model_executor.determine_num_available_blocks()
        max_model_len = self.vllm_config.model_config.max_model_len
        if num_blocks * cache_config.block_size < max_model_len:
            raise ValueError(
                f"The KV cache holds {num_blocks} blocks of {cache_config.block_size} tokens "
                f"({num_blocks * cache_config.block_size} tokens), fewer than max_model_len "
                f"({max_model_len}): lower max_model_len or give the KV cache more blocks or memory."
            )
        self.model_executor.initialize_cache(num_blocks)
        cache_config.num_gpu_blocks = num_blocks
        return num_blocks

    def add_request(self, request: EngineCoreRequest) -> None:
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the engine.")
        self.scheduler.add_request(Request.from_engine_core_request(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(timestamp=time.time())
        self.step_counter += 1
        if self.tracer is not None:
            return self._traced_step()
        scheduler_output = self.scheduler.schedule()
        model_output = self.model_executor.execute_model(scheduler_output)
        sampler_output = self.model_executor.sample_tokens(model_output)
        return self.scheduler.update_from_output(scheduler_output, model_output, sampler_output)

    def _traced_step(self) -> EngineCoreOutputs:
        """``step()`` with an ``engine_step`` trace: one child span per stage, links to the requests."""
        tracer = self.tracer
        with tracer.start_as_current_span(
            "engine_step", context=trace.set_span_in_context(trace.INVALID_SPAN)
        ) as step_span:
            with tracer.start_as_current_span("schedule"):
                scheduler_output = self.scheduler.schedule()
            self._describe_step(step_span, scheduler_output)
            with tracer.start_as_current_span("execute_model"):
                model_output = self.model_executor.execute_model(scheduler_output)
            with tracer.start_as_current_span("sample"):
                sampler_output = self.model_executor.sample_tokens(model_output)
            with tracer.start_as_current_span("update_from_output"):
                outputs = self.scheduler.update_from_output(scheduler_output, model_output, sampler_output)
            stats = outputs.scheduler_stats
            step_span.set_attribute("step.num_free_blocks", self.scheduler.kv_cache_manager.num_free_blocks)
            step_span.set_attribute("step.kv_cache_usage", stats.kv_cache_usage)
            step_span.set_attribute("step.num_running_reqs", stats.num_running_reqs)
            step_span.set_attribute("step.num_waiting_reqs", stats.num_waiting_reqs)
            return outputs

    def _describe_step(self, span, scheduler_output: SchedulerOutput) -> None:
        """What the trace replay needs: who ran, with how many tokens, prefill or decode."""
        requests = self.scheduler.requests
        req_ids = list(scheduler_output.num_scheduled_tokens)
        num_tokens = [scheduler_output.num_scheduled_tokens[r] for r in req_ids]
        # After schedule(), num_computed_tokens already includes this step's tokens.
        is_decode = [
            requests[r].num_output_tokens > 0 and n == 1 and requests[r].num_computed_tokens == requests[r].num_tokens
            for r, n in zip(req_ids, num_tokens)
        ]
        for r in req_ids:
            if requests[r].span is not None:
                span.add_link(requests[r].span.get_span_context())
        span.set_attributes({
            "step.number": self.step_counter,
            "step.batch_size": len(req_ids),
            "step.num_scheduled_tokens": scheduler_output.total_num_scheduled_tokens,
            "step.token_budget": self.scheduler.max_num_batched_tokens,
            "step.num_prefill_tokens": sum(n for n, d in zip(num_tokens, is_decode) if not d),
            "step.num_decode_tokens": sum(n for n, d in zip(num_tokens, is_decode) if d),
            "step.req_ids": req_ids,
            "step.req_num_tokens": num_tokens,
            "step.req_is_decode": is_decode,
            "step.preempted_req_ids": sorted(scheduler_output.preempted_req_ids),
        })
