"""Scheduler: decides, each step, which requests compute how many tokens.

The V1 rule: there is no prefill phase and no decode phase. Every request has ``num_tokens`` (prompt
plus tokens generated so far) and ``num_computed_tokens`` (tokens whose KV is cached); each step the
scheduler lets ``num_computed_tokens`` catch up with ``num_tokens`` as far as a per-step token budget
(``max_num_batched_tokens``) and ``max_num_seqs`` allow. A long prompt is thus computed in chunks
(chunked prefill), a decode is the case "one token behind", and prefills and decodes share a batch.

Order within a step:
1. RUNNING requests first, in order. If ``allocate_slots`` finds no free blocks, the newest running
   request (lowest priority under the priority policy) is preempted: its blocks are freed, it goes
   back to the waiting queue and will recompute its tokens later.
2. Then WAITING requests (new or preempted), head first, unless something was preempted this step:
   prefix-cache hits first (``get_computed_blocks``), then blocks for the rest. A waiting request that
   does not fit stops the loop, so requests are admitted in queue order.
"""

from __future__ import annotations

import time

from opentelemetry.trace import Tracer

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.core.kv_cache_manager import KVCacheManager
from tracevllm.core.kv_cache_utils import hash_request_tokens
from tracevllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from tracevllm.core.sched.request_queue import create_request_queue
from tracevllm.core.sched.utils import check_stop
from tracevllm.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs, SchedulerStats
from tracevllm.request import Request, RequestStatus
from tracevllm.tracing import SpanAttributes, extract_trace_context
from tracevllm.worker.outputs import ModelRunnerOutput, SamplerOutput


class Scheduler:
    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, tracer: Tracer | None = None,
        track_block_changes: bool = False,
    ) -> None:
        self.max_num_seqs = scheduler_config.max_num_seqs
        self.max_num_batched_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.policy = scheduler_config.policy
        self.enable_chunked_prefill = scheduler_config.enable_chunked_prefill
        self.block_size = cache_config.block_size
        self.enable_caching = cache_config.enable_prefix_caching
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks=cache_config.num_gpu_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            enable_caching=self.enable_caching,
        )
        self.tracer = tracer

        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # Finished since the last schedule(): the model runner is told to forget them.
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0  # since the last make_stats()
        # Step tracing only: each request's KV block references taken and dropped since the last
        # take_block_changes() (one step, plus the aborts before it), for the engine_step span.
        self.track_block_changes = track_block_changes
        self.blocks_allocated: dict[str, list[int]] = {}
        self.blocks_freed: dict[str, list[int]] = {}

    # ---- requests in and out -------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if self.enable_caching:
            request.block_hashes = hash_request_tokens(self.block_size, request)
        self.waiting.add_request(request)
        self.requests[request.request_id] = request
        request.record_event(EngineCoreEventType.QUEUED)
        if self.tracer is not None:
            request.span = self.tracer.start_span(
                "scheduler.request",
                context=extract_trace_context(request.trace_headers),
                attributes={
                    SpanAttributes.GEN_AI_REQUEST_ID: request.request_id,
                    "request.num_prompt_tokens": request.num_prompt_tokens,
                    "request.priority": request.priority,
                },
            )
            request.span.add_event("QUEUED")

    def finish_requests(self, request_ids: str | list[str], finished_status: RequestStatus) -> None:
        """Finish requests from outside the step (aborts, stop strings found by the front end)."""
        assert RequestStatus.is_finished(finished_status)
        for req_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove_request(request)
            request.status = finished_status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        freed = self.kv_cache_manager.get_block_ids(request.request_id)
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]
        self._record_blocks(self.blocks_freed, request, freed)
        if request.span is not None:
            request.span.add_event("kv.blocks_freed", {"block_ids": freed})
            request.span.add_event("FINISHED", {"finish_reason": str(request.get_finished_reason())})
            request.span.set_attribute("request.num_output_tokens", request.num_output_tokens)
            request.span.set_attribute("request.num_preemptions", request.num_preemptions)
            request.span.end()

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    # ---- one step ------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        token_budget = self.max_num_batched_tokens
        num_scheduled_tokens: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        scheduled_resumed: list[Request] = []
        preempted: list[Request] = []
        now = time.time()

        # 1. Running requests.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = min(request.num_tokens - request.num_computed_tokens, token_budget)
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
                if new_blocks is not None:
                    break
                victim = self._pick_preemption_victim()
                if victim.request_id in num_scheduled_tokens:  # priority policy: one scheduled earlier
                    token_budget += num_scheduled_tokens.pop(victim.request_id)
                    new_block_ids.pop(victim.request_id)
                    scheduled_running.remove(victim)
                    req_index -= 1
                self._preempt(victim, now)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:  # the request preempted itself
                continue
            scheduled_running.append(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            new_block_ids[request.request_id] = new_blocks.get_block_ids()
            token_budget -= num_new_tokens
            req_index += 1
            if self.tracer is not None:
                self._trace_allocation(request, new_block_ids[request.request_id], num_new_tokens)

        # 2. Waiting requests, unless this step had to preempt (memory is short).
        while not preempted and len(self.waiting) > 0 and token_budget > 0:
            if len(self.running) == self.max_num_seqs:
                break
            request = self.waiting.peek_request()
            computed_blocks, num_computed_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new_tokens = request.num_tokens - num_computed_tokens
            if not self.enable_chunked_prefill and num_new_tokens > token_budget:
                break
            num_new_tokens = min(num_new_tokens, token_budget)
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens, num_computed_tokens, computed_blocks
            )
            if new_blocks is None:
                break
            self.waiting.pop_request()
            self.running.append(request)
            (scheduled_new if request.status == RequestStatus.WAITING else scheduled_resumed).append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_computed_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_computed_tokens
            request.record_event(EngineCoreEventType.SCHEDULED, now)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            new_block_ids[request.request_id] = self.kv_cache_manager.get_block_ids(request.request_id)
            token_budget -= num_new_tokens
            if self.tracer is not None:
                self._trace_scheduled(request, computed_blocks.get_block_ids(), new_block_ids[request.request_id],
                                      num_computed_tokens, num_new_tokens)

        scheduler_output = SchedulerOutput(
            scheduled_new_reqs=[
                NewRequestData.from_request(r, new_block_ids[r.request_id]) for r in scheduled_new
            ],
            scheduled_cached_reqs=self._make_cached_request_data(
                scheduled_running, scheduled_resumed, new_block_ids
            ),
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=self.max_num_batched_tokens - token_budget,
            preempted_req_ids={r.request_id for r in preempted},
            finished_req_ids=self.finished_req_ids,
        )
        # The KV of the scheduled tokens will exist once the step runs: advance now, so the next
        # schedule() (possibly before this step's output is back) sees the new state.
        for req_id, n in num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += n
        self.finished_req_ids = set()
        return scheduler_output

    def _pick_preemption_victim(self) -> Request:
        if self.policy == "priority":
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
            self.running.remove(victim)
            return victim
        return self.running.pop()

    def _preempt(self, request: Request, now: float) -> None:
        freed = self.kv_cache_manager.get_block_ids(request.request_id)
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        request.record_event(EngineCoreEventType.PREEMPTED, now)
        self.waiting.prepend_request(request)
        self._record_blocks(self.blocks_freed, request, freed)
        if request.span is not None:
            request.span.add_event("PREEMPTED", {"num_output_tokens": request.num_output_tokens})
            request.span.add_event("kv.blocks_freed", {"block_ids": freed})

    def _trace_scheduled(self, request: Request, hit_ids: list[int], block_ids: list[int],
                         num_computed_tokens: int, num_new_tokens: int) -> None:
        """A waiting request got its blocks: its prefix-cache hits (the first blocks) and new ones."""
        self._record_blocks(self.blocks_allocated, request, hit_ids)
        if request.span is not None:
            request.span.add_event(
                "SCHEDULED", {"num_computed_tokens": num_computed_tokens, "resumed": request.num_preemptions > 0}
            )
            if num_computed_tokens > 0:
                request.span.add_event(
                    "kv.prefix_cache_hit", {"block_ids": hit_ids, "num_cached_tokens": num_computed_tokens}
                )
        self._trace_allocation(request, block_ids[len(hit_ids):], num_new_tokens)

    def _trace_allocation(self, request: Request, block_ids: list[int], num_new_tokens: int) -> None:
        self._record_blocks(self.blocks_allocated, request, block_ids)
        if request.span is not None and block_ids:
            request.span.add_event(
                "kv.blocks_allocated", {"block_ids": block_ids, "num_new_tokens": num_new_tokens}
            )

    def _record_blocks(self, ledger: dict[str, list[int]], request: Request, block_ids: list[int]) -> None:
        if self.track_block_changes and block_ids:
            ledger.setdefault(request.request_id, []).extend(block_ids)

    def take_block_changes(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """The block references taken (new blocks and prefix-cache hits) and dropped per request
        since the last call. Replaying them from the start gives each block's reference count: the
        blocks with a count > 0 plus the free blocks are all the blocks."""
        changes = self.blocks_allocated, self.blocks_freed
        self.blocks_allocated, self.blocks_freed = {}, {}
        return changes

    @staticmethod
    def _make_cached_request_data(
        running: list[Request], resumed: list[Request], new_block_ids: dict[str, list[int]]
    ) -> CachedRequestData:
        data = CachedRequestData()
        for request, was_resumed in [(r, False) for r in running] + [(r, True) for r in resumed]:
            data.req_ids.append(request.request_id)
            data.resumed_from_preemption.append(was_resumed)
            data.new_block_ids.append(new_block_ids[request.request_id])
            data.num_computed_tokens.append(request.num_computed_tokens)
        return data

    # ---- after the step ------------------------------------------------------------------------

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        model_runner_output: ModelRunnerOutput,
        sampler_output: SamplerOutput,
    ) -> EngineCoreOutputs:
        """Append each sampled token to its request, check stops, free finished requests.

        This is the only place that turns the step's results into ``EngineCoreOutput``s.
        """
        sampled_token_ids = sampler_output.sampled_token_ids.tolist()
        logprobs = sampler_output.logprobs_tensors
        logprobs_lists = logprobs.tolists() if logprobs is not None else None
        outputs: list[EngineCoreOutput] = []
        any_stopped = False
        for row, req_id in enumerate(model_runner_output.sampling_req_ids):
            request = self.requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # finished or preempted while the step ran
            token_id = sampled_token_ids[row]
            request.append_output_token_ids(token_id)
            stopped = check_stop(request, self.max_model_len)
            new_logprobs = None
            if logprobs_lists is not None and request.sampling_params.logprobs is not None:
                new_logprobs = logprobs_lists.slice(row, row + 1)
            outputs.append(
                EngineCoreOutput(
                    request_id=req_id,
                    new_token_ids=[token_id],
                    new_logprobs=new_logprobs,
                    finish_reason=request.get_finished_reason(),
                    stop_reason=request.stop_reason,
                    events=request.take_events(),
                    num_cached_tokens=request.num_cached_tokens,
                )
            )
            if stopped:
                any_stopped = True
                self._free_request(request)
        if any_stopped:
            self.running = [r for r in self.running if not r.is_finished()]
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats(), timestamp=time.time())

    def make_stats(self) -> SchedulerStats:
        prefix_stats = self.kv_cache_manager.make_prefix_cache_stats()
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=prefix_stats.queries,
            prefix_cache_hits=prefix_stats.hits,
            num_preemptions=self.num_preemptions,
        )
        self.num_preemptions = 0
        return stats
