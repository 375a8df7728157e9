"""Scheduler: decides, each step, which requests compute how many tokens.

The V1 rule: there is no prefill phase and no decode phase. Every request has ``num_tokens`` (prompt
plus tokens generated so far) and ``num_computed_tokens`` (tokens whose KV is cached); each step the
scheduler lets ``num_computed_tokens`` catch up with ``num_tokens`` as far as a per-step token budget
(``max_num_batched_tokens``) and ``max_num_seqs`` allow. A long prompt is thus computed in chunks
(chunked prefill), a decode is the case "one token behind", and prefills and decodes share a batch.

Order within a step (``schedule()``, one method per phase, both spending one ``StepBatch``'s budget,
``step_batch.py``):
1. RUNNING requests first, in order (``_schedule_running``). If ``allocate_slots`` finds no free
   blocks, the newest running request (lowest priority under the priority policy) is preempted: its
   blocks are freed, it goes back to the waiting queue and will recompute its tokens later.
2. Then WAITING requests (new or preempted), head first, unless something was preempted this step
   (``_schedule_waiting``): prefix-cache hits first (``get_computed_blocks``), then blocks for the
   rest. A waiting request that does not fit stops the loop, so requests are admitted in queue order.

Why the requests left waiting wait is counted every step for ``SchedulerStats``: the head for what
stopped the step's admissions (``HoldBack``: the token budget, ``max_num_seqs``, the KV cache, a
preemption, tokens in flight), every other one ``queued_behind`` the request ahead of it. When
observed, each waiting request records a ``RequestWaiting`` whenever its reason changes
(``waiting_reasons.py``).

With ``async_scheduling`` the engine core builds ``AsyncScheduler`` instead (``async_scheduler.py``):
the same rules, with each token in flight counted as a placeholder.
"""

from __future__ import annotations

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import (
    BatchScheduled, RequestEvent, RequestFinished, RequestPreempted, RequestQueued, RequestResumed,
    RequestScheduled, RequestWorkload, ScheduledRequest, StepGauges,
)
from tracevllm.core.kv_cache_manager import KVCacheManager
from tracevllm.core.kv_cache_utils import hash_request_tokens
from tracevllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from tracevllm.core.sched.request_queue import create_request_queue
from tracevllm.core.sched.step_batch import HoldBack, StepBatch
from tracevllm.core.sched.utils import check_stop
from tracevllm.core.sched.waiting_reasons import WaitingReasons
from tracevllm.engine import EngineCoreOutput, EngineCoreOutputs, SchedulerStats
from tracevllm.request import Request, RequestStatus
from tracevllm.model_runner_output import SAMPLING_FAILED, ModelRunnerOutput, SamplerOutput


class Scheduler:
    """Records a request event at each change of a request's state (also sent to the front end in
    the request's next ``EngineCoreOutput``) and, when observed, holds each step's ``BatchScheduled``
    and ``StepGauges`` for its ``StepRecord`` (``core/events.py``)."""

    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, recorder: EventRecorder | None = None,
        use_pp: bool = False,
    ) -> None:
        # With pipeline parallelism the first stage never sees the sampled tokens (the last stage
        # samples): each step then sends every request's tokens to compute (``new_token_ids``).
        self.use_pp = use_pp
        self.max_num_seqs = scheduler_config.max_num_seqs
        self.max_num_batched_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.policy = scheduler_config.policy
        self.enable_chunked_prefill = scheduler_config.enable_chunked_prefill
        self.long_prefill_token_threshold = scheduler_config.long_prefill_token_threshold
        self.scheduler_reserve_full_isl = scheduler_config.scheduler_reserve_full_isl
        self.block_size = cache_config.block_size
        self.enable_caching = cache_config.enable_prefix_caching
        self.recorder = recorder or EventRecorder()
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks=cache_config.num_gpu_blocks, block_size=self.block_size, max_model_len=self.max_model_len,
            enable_caching=self.enable_caching, recorder=self.recorder, watermark=scheduler_config.watermark)

        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # Finished since the last schedule(): the model runner is told to forget them.
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0  # since the last make_stats()
        # Batches scheduled and not yet back, per request: how many. More than one batch is in flight
        # with pipeline parallelism or asynchronous scheduling (``EngineCore.step_with_batch_queue``);
        # a preempted request waits until none of its tokens are (``_schedule_waiting``).
        self.num_in_flight: dict[str, int] = {}
        # Why the last schedule() left requests waiting (``SchedulerStats``), and, when observed, each
        # waiting request's last recorded reason (``waiting_reasons.py``).
        self.num_waiting_by_reason: dict[str, int] = {}
        self.waiting_reasons = WaitingReasons(self.waiting, joins_at_tail=self.policy == "fcfs")

    # ---- requests in and out -------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if self.enable_caching:
            request.block_hashes = hash_request_tokens(self.block_size, request.all_token_ids)
        self.waiting.add_request(request)
        self.waiting_reasons.joined()
        self.requests[request.request_id] = request
        self._record(request, RequestQueued(request.request_id, self.recorder.now(), request.num_prompt_tokens,
                                            request.priority, request.trace_headers))
        if self.recorder.enabled:
            self.recorder.record(self._describe_workload(request))

    def _describe_workload(self, request: Request) -> RequestWorkload:
        """The request as a replay would submit it again (``RequestWorkload``): its prompt's block
        hashes, the ones ``add_request`` just made or, with prefix caching off, made for this."""
        params = request.sampling_params
        hashes = request.block_hashes if self.enable_caching else hash_request_tokens(
            self.block_size, request.prompt_token_ids)
        return RequestWorkload(request.request_id, self.block_size, list(hashes), request.max_tokens,
                               params.min_tokens, params.ignore_eos, params.prompt_logprobs is not None)

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
                self.waiting_reasons.moved()
            request.status = finished_status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        freed = self.kv_cache_manager.get_block_ids(request.request_id)
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        self.waiting_reasons.forget(request.request_id)
        del self.requests[request.request_id]
        self._record(request, RequestFinished(
            request.request_id, self.recorder.now(), str(request.get_finished_reason()), request.stop_reason,  # type: ignore[arg-type]
            request.num_output_tokens, request.num_preemptions, max(request.num_cached_tokens, 0), freed,
        ))

    def _record(self, request: Request, event: RequestEvent) -> None:
        """A change of the request's state: for the front end (in the request's next output) and
        for the engine's observers."""
        request.events.append(event)
        if self.recorder.enabled:
            self.recorder.record(event)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ones the model runner has not been told of yet."""
        return self.has_unfinished_requests() or bool(self.finished_req_ids)

    # ---- one step ------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """The step's batch: 1. the running requests, 2. the waiting ones, unless a running one had
        to be preempted (memory is short).

        ``long_prefill_token_threshold`` caps a request's tokens a step so that one long prompt does not
        starve the others; with one request in the engine there is nobody to starve, and it is off."""
        alone = len(self.running) + len(self.waiting) <= 1
        batch = StepBatch(self.max_num_batched_tokens, self.recorder.now(),
                          0 if alone else self.long_prefill_token_threshold)
        self._schedule_running(batch)
        hold_back = HoldBack("preemption") if batch.preempted_reqs else self._schedule_waiting(batch)
        self.num_waiting_by_reason = hold_back.count_waiting(len(self.waiting)) if hold_back and self.waiting else {}
        scheduler_output = self._make_scheduler_output(batch)
        if self.recorder.enabled:
            self.recorder.hold_for_step(self._describe_batch(scheduler_output))
            if hold_back is not None:
                for waiting in self.waiting_reasons.changed(hold_back, batch):
                    self.recorder.record(waiting)
        # The KV of the scheduled tokens will exist once the step runs: advance now, so the next
        # schedule() (possibly before this step's output is back) sees the new state.
        for req_id, n in batch.num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += n
            self.num_in_flight[req_id] = self.num_in_flight.get(req_id, 0) + 1
        self.finished_req_ids = set()
        return scheduler_output

    def _schedule_running(self, batch: StepBatch) -> None:
        """1. Each running request, in order, gets the tokens it is behind (as many as the budget
        leaves) and the blocks for them. While blocks run out, a victim is preempted
        (``_pick_preemption_victim``) and the allocation retried. A request that was its own victim
        ends the loop: memory is short, and the requests after it wait for the next step."""
        req_index = 0
        while req_index < len(self.running) and batch.token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = batch.tokens_for(self._num_new_tokens(request))
            if num_new_tokens == 0:
                # Its last scheduled tokens are still in flight (EngineCore.step_with_batch_queue):
                # the token they sample is not known yet (or, scheduling asynchronously, it will be
                # the request's last).
                req_index += 1
                continue
            while (new_blocks := self.kv_cache_manager.allocate_slots(request, num_new_tokens)) is None:
                victim_index, victim = self._pick_preemption_victim()
                if victim_index < req_index:  # priority policy: one served earlier in this loop
                    req_index -= 1
                    batch.remove_running(victim)
                self._preempt(victim, batch.timestamp, request, num_new_tokens)
                batch.preempted_reqs.append(victim)
                if victim is request:
                    return
            batch.add_running(request, num_new_tokens, new_blocks.get_block_ids())
            req_index += 1

    def _num_new_tokens(self, request: Request) -> int:
        """The tokens a running request is behind: those it has and has not computed (0 while the
        token its last scheduled tokens sample is in flight)."""
        return request.num_tokens - request.num_computed_tokens

    def _schedule_waiting(self, batch: StepBatch) -> HoldBack | None:
        """2. Waiting requests, head first, while the budget and ``max_num_seqs`` allow: each gets its
        prefix-cache hit, then blocks for the rest (capped by the budget), if the free blocks hold its
        whole prompt (``scheduler_reserve_full_isl``, vLLM's rule since 0.32), less the watermark while
        others run. The first that does not fit stops the loop, so requests are admitted in queue
        order. Returns why the loop stopped with requests still waiting (None: none are)."""
        while len(self.waiting) > 0:
            if batch.token_budget <= 0:
                return HoldBack("token_budget")
            if len(self.running) >= self.max_num_seqs:
                return HoldBack("max_num_seqs")
            request = self.waiting.peek_request()
            if request.request_id in self.num_in_flight:  # preempted while its last batch is in flight
                return HoldBack("in_flight")
            computed_blocks, num_computed_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new_tokens = request.num_tokens - num_computed_tokens
            if not self.enable_chunked_prefill and num_new_tokens > batch.token_budget:
                return HoldBack("token_budget")
            num_new_tokens = batch.tokens_for(num_new_tokens)
            # vLLM 0.32's two gates: the whole prompt must fit, and while others run the watermark stays free.
            gates = {"full_sequence_must_fit": self.scheduler_reserve_full_isl, "has_scheduled_reqs": bool(self.running)}
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens, num_computed_tokens, computed_blocks, **gates)
            if new_blocks is None:
                return HoldBack("kv_cache", self.kv_cache_manager.refusal(
                    request, num_new_tokens, num_computed_tokens, computed_blocks, **gates))
            self.waiting.pop_request()
            self.running.append(request)
            resumed = request.status == RequestStatus.PREEMPTED
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_computed_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_computed_tokens
            batch.add_waiting(request, num_new_tokens, self.kv_cache_manager.get_block_ids(request.request_id), resumed)
            hit_block_ids = computed_blocks.get_block_ids()
            lookup = None
            if self.recorder.enabled:
                self.waiting_reasons.forget(request.request_id)
                lookup = self.kv_cache_manager.describe_lookup(request, len(hit_block_ids))
            self._record(request, (RequestResumed if resumed else RequestScheduled)(
                request.request_id, batch.timestamp, num_new_tokens, num_computed_tokens,
                hit_block_ids, new_blocks.get_block_ids(), lookup,
            ))
        return None

    def _describe_batch(self, scheduler_output: SchedulerOutput) -> BatchScheduled:
        """The step's batch for observers; called before ``num_computed_tokens`` advances. A request
        decodes when it has output tokens and computes exactly the one token it is behind; anything
        else (prompt chunks, recomputation after a preemption) is a prefill. A token in flight
        (``AsyncScheduler``'s placeholder) counts as one it has."""
        scheduled = []
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            placeholders = request.num_output_placeholders
            behind = request.num_tokens + placeholders - request.num_computed_tokens
            is_decode = request.num_output_tokens + placeholders > 0 and n == 1 and behind == 1
            scheduled.append(ScheduledRequest(req_id, n, is_decode, request.num_computed_tokens))
        return BatchScheduled(scheduled, sorted(scheduler_output.preempted_req_ids), self.max_num_batched_tokens,
                              scheduler_output.total_num_scheduled_tokens)

    def _pick_preemption_victim(self) -> tuple[int, Request]:
        """Take the victim out of ``running``, with the index it had: the newest request (fcfs), or the
        one with the largest (priority, arrival time), the first such one in running order (priority)."""
        if self.policy == "priority":
            index, victim = max(enumerate(self.running), key=lambda x: (x[1].priority, x[1].arrival_time))
            del self.running[index]
            return index, victim
        return len(self.running) - 1, self.running.pop()

    def _preempt(self, request: Request, now: float, forced_by: Request, num_new_tokens: int) -> None:
        """Free ``request``'s blocks and put it back in the waiting queue, because ``forced_by`` found
        no blocks for its ``num_new_tokens``."""
        num_blocks_needed = self.kv_cache_manager.get_num_blocks_to_allocate(forced_by, num_new_tokens)
        num_free_blocks = self.kv_cache_manager.num_free_blocks
        freed = self.kv_cache_manager.get_block_ids(request.request_id)
        num_lost_tokens = request.num_computed_tokens
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        # Its batches in flight still deliver their tokens (sampled from the right KV), but no longer
        # as placeholders: they arrive stale (``update_from_output``).
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.waiting_reasons.moved()
        self._record(request, RequestPreempted(request.request_id, now, request.num_output_tokens, freed,
                                               forced_by.request_id, num_blocks_needed, num_free_blocks,
                                               self.policy, num_lost_tokens))

    def _make_scheduler_output(self, batch: StepBatch) -> SchedulerOutput:
        return SchedulerOutput(
            scheduled_new_reqs=[
                NewRequestData.from_request(r, batch.req_to_new_block_ids[r.request_id])
                for r in batch.scheduled_new_reqs
            ],
            scheduled_cached_reqs=self._make_cached_request_data(batch),
            num_scheduled_tokens=batch.num_scheduled_tokens,
            total_num_scheduled_tokens=self.max_num_batched_tokens - batch.token_budget,
            preempted_req_ids={r.request_id for r in batch.preempted_reqs},
            finished_req_ids=self.finished_req_ids,
        )

    def _make_cached_request_data(self, batch: StepBatch) -> CachedRequestData:
        """The diffs for the scheduled requests the model runner knows: running ones, then resumed."""
        data = CachedRequestData()
        running = [(r, False) for r in batch.scheduled_running_reqs]
        for request, was_resumed in running + [(r, True) for r in batch.scheduled_resumed_reqs]:
            data.req_ids.append(request.request_id)
            data.resumed_from_preemption.append(was_resumed)
            data.new_block_ids.append(batch.req_to_new_block_ids[request.request_id])
            data.num_computed_tokens.append(request.num_computed_tokens)
            if self.use_pp:
                start = request.num_computed_tokens
                num_tokens = batch.num_scheduled_tokens[request.request_id]
                data.new_token_ids.append(request.all_token_ids[start:start + num_tokens])
        return data

    # ---- after the step ------------------------------------------------------------------------

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        model_runner_output: ModelRunnerOutput,
        sampler_output: SamplerOutput,
    ) -> EngineCoreOutputs:
        """Append each sampled token to its request, check stops, free finished requests. A row
        the sampler marked failed finishes its request with ``FinishReason.ERROR`` instead.

        This is the only place that turns the step's results into ``EngineCoreOutput``s.
        """
        for req_id in scheduler_output.num_scheduled_tokens:
            if (n := self.num_in_flight.pop(req_id) - 1) > 0:
                self.num_in_flight[req_id] = n
        sampled_token_ids = sampler_output.sampled_token_ids.tolist()
        failed_rows = sampler_output.failed.tolist() if sampler_output.failed is not None else None
        logprobs = sampler_output.logprobs_tensors
        logprobs_lists = logprobs.tolists() if logprobs is not None else None
        outputs: list[EngineCoreOutput] = []
        any_stopped = False
        for row, req_id in enumerate(model_runner_output.sampling_req_ids):
            request = self.requests.get(req_id)
            if request is None:
                continue  # finished (aborted) while the step ran
            # A request preempted while its step was in flight (only with the batch queue) keeps
            # the token: it was sampled from the right KV, and the runner that sampled it has it. It is
            # still waiting (it is admitted again only once none of its batches is in flight): its
            # output is stale.
            # A row that failed to sample (no valid distribution: NaN or infinite logits) ends its
            # request with ERROR and no token; the rest of the batch goes on.
            failed = failed_rows is not None and failed_rows[row]
            new_token_ids = [] if failed else [sampled_token_ids[row]]
            was_waiting = request.status == RequestStatus.PREEMPTED  # its status, not a scan of the queue
            if failed:
                request.status, request.stop_reason = RequestStatus.FINISHED_ERROR, SAMPLING_FAILED
            stopped = failed or self._update_request_with_output(request, new_token_ids, was_waiting)
            if stopped:
                any_stopped = True
                if was_waiting:
                    self.waiting.remove_request(request)
                    self.waiting_reasons.moved()
                self._free_request(request)
            new_logprobs = None
            if logprobs_lists is not None and request.sampling_params.logprobs is not None and not failed:
                new_logprobs = logprobs_lists.slice(row, row + 1)
            prompt_logprobs = model_runner_output.prompt_logprobs_dict.get(req_id)
            outputs.append(
                EngineCoreOutput(
                    request_id=req_id,
                    new_token_ids=new_token_ids,
                    new_logprobs=new_logprobs,
                    new_prompt_logprobs=prompt_logprobs.tolists() if prompt_logprobs is not None else None,
                    finish_reason=request.get_finished_reason(),
                    stop_reason=request.stop_reason,
                    events=request.take_events(),
                    num_cached_tokens=request.num_cached_tokens,
                )
            )
        if any_stopped:
            self.running = [r for r in self.running if not r.is_finished()]
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats(), timestamp=self.recorder.now())

    def _update_request_with_output(self, request: Request, new_token_ids: list[int], is_stale: bool) -> bool:
        """Append the step's sampled token to the request; whether the request stops with it.
        ``is_stale``: the request was preempted while the step ran (only ``AsyncScheduler`` reads it)."""
        request.append_output_token_ids(new_token_ids)
        return check_stop(request, self.max_model_len)

    def hold_step_gauges(self) -> None:
        """The KV cache and queues now, held for the step's record when observed."""
        if self.recorder.enabled:
            self.recorder.hold_for_step(StepGauges(
                self.kv_cache_manager.num_free_blocks, self.kv_cache_manager.block_pool.num_gpu_blocks,
                self.kv_cache_manager.usage, len(self.running), len(self.waiting),
            ))

    def make_stats(self) -> SchedulerStats:
        prefix_stats = self.kv_cache_manager.make_prefix_cache_stats()
        self.hold_step_gauges()
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=prefix_stats.queries,
            prefix_cache_hits=prefix_stats.hits,
            num_preemptions=self.num_preemptions,
            num_waiting_reqs_by_reason=self.num_waiting_by_reason,
        )
        self.num_preemptions = 0
        return stats
