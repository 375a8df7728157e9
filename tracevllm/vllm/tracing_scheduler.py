"""``TracingScheduler``: vLLM 0.32's ``Scheduler``, recording what it decides as tracevllm's events.

Every decision is vLLM's: each overridden method calls vLLM's own and only watches, before and after,
what changed. What it records is what tracevllm's scheduler records (``core/events.py``), so that
tracevllm's tracer (``tracing/engine_tracer.py``) draws the same spans from it:

    add_request ───────── RequestQueued, RequestWorkload (and the llm_request span opens: tracing/vllm_tracer.py)
    schedule ──────────── StepStarted; RequestPreempted (inside, as vLLM preempts), RequestScheduled /
                          RequestResumed, the KV blocks taken, the batch; RequestWaiting (why the queue waits)
    update_from_output ── RequestFinished, the gauges, the StepRecord; EngineIdle when nothing is left
    finish_requests ───── RequestFinished (aborts, from outside the step)

Where vLLM keeps no record of a decision, it is told from what vLLM's objects show:
- **why the queue's head waits** (``_hold_back``), in the order vLLM's admission loop checks: a
  preemption this step, the token budget spent, ``max_num_seqs`` running, the KV cache (the head's
  refused ``allocate_slots``, seen by a wrapper around vLLM's own), a prompt over the budget left
  without chunked prefill. Anything else (a KV connector's load, LoRA limits) records no reason;
- **the blocks a refused allocation needed** (``_shortage``): computed as vLLM computes them for one
  full-attention KV cache group (the models tracevllm runs), the watermark included;
- **who forced a preemption**: the request whose ``allocate_slots`` was refused last.

With ``TRACEVLLM_LIVE_PORT`` set, the same events also go to the live page, served by a side
process (``live.py``) that asks for them only while a client watches. Its control thread must see the
scheduler between two steps, hence ``step_lock``: whoever holds it sees no step under way and no
request coming or going. The engine core's thread holds it from ``schedule()`` to the end of
``update_from_output()`` (the forward pass included: a client joining mid-step waits for the step's
end), and across ``add_request``, ``finish_requests``, ``reset_prefix_cache`` and ``shutdown``, the
scheduler's changes from outside a step. It is reentrant: vLLM aborts requests inside a step
(``_process_aborts_queue``). Uncontended, as it nearly always is, it costs well under a microsecond
a call.

Request ids are vLLM's external ones (the caller's: vLLM's front end makes each unique by appending
``-`` and 8 random characters, ``InputProcessor.assign_request_id``), unless one repeats in the run;
then vLLM's own id. Block hashes in the workload are
tracevllm's (``kv_cache_utils.hash_request_tokens``): a replay only needs equal prefixes to hash equal.
The prefix cache's gains and losses are seen by wrapping two methods of vLLM's ``BlockPool``
(``cache_full_blocks``; the eviction of a cached block as ``get_new_blocks`` hands it out).

A step of the trace is one call of vLLM's engine core. Synchronously that is ``schedule`` to
``update_from_output``. With a batch queue (``TracingAsyncScheduler``, below: vLLM's asynchronous
scheduling, its default on GPUs; vLLM-CPU turns it off) a call schedules step N + 1 and then applies
step N's output, or only puts its batch in flight and returns; such a call's record closes at the next
``schedule()``, and a call that only applies an output opens its own. Not recorded yet: KV connectors,
speculative decoding, and models with more than one KV cache group (sliding windows, Mamba).
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import msgspec

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from tracevllm.core.event_recorder import StepTimer
from tracevllm.core.events import (
    AllBlocksCleared, BatchScheduled, BlocksAllocated, BlocksEvicted, BlocksFreed, BlocksStored, EngineIdle,
    PrefixCacheHit, PrefixCacheLookup, RequestFinished, RequestPreempted, RequestQueued, RequestResumed,
    RequestScheduled, RequestWaiting, RequestWorkload, ScheduledRequest, StepGauges,
)
from tracevllm.core.kv_cache_manager import KVShortage
from tracevllm.core.kv_cache_utils import hash_new_full_blocks, hash_request_tokens
from tracevllm.core.sched.step_batch import HoldBack, StepBatch
from tracevllm.core.sched.waiting_reasons import WaitingReasons
from tracevllm.core.stages import Stage
from tracevllm.tracing.vllm_tracer import (
    LlmRequestArrived, LlmRequestFinished, LlmRequestFirstToken, LlmRequestScheduled, new_trace_headers,
)
from tracevllm.vllm.live import LivePage, live_socket
from tracevllm.vllm.recording import VllmRecording

_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
# The start-up error of a recorder that does not match how vLLM schedules (by async_scheduling).
_WRONG_RECORDER = {
    True: "tracevllm.vllm.TracingScheduler records vLLM's synchronous Scheduler, and async scheduling is on: "
          "pass scheduler_cls='tracevllm.vllm.TracingAsyncScheduler' (--scheduler-cls "
          "tracevllm.vllm.TracingAsyncScheduler) to record vLLM's AsyncScheduler, or turn async scheduling off",
    False: "tracevllm.vllm.TracingAsyncScheduler records vLLM's AsyncScheduler, and vLLM schedules synchronously "
           "here (async scheduling is off; vLLM-CPU always turns it off): pass "
           "scheduler_cls='tracevllm.vllm.TracingScheduler' (--scheduler-cls tracevllm.vllm.TracingScheduler)",
}


def _external_id(request_id: str) -> str:
    """The caller's id of vLLM's ``"<external>-<8 random characters>"`` (as is when not of that form)."""
    external, dash, suffix = request_id.rpartition("-")
    return external if dash and external and len(suffix) == 8 else request_id


class TracingScheduler(Scheduler):
    """vLLM's ``Scheduler``, unchanged in every decision, recording each as tracevllm's events."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if bool(self.scheduler_config.async_scheduling) != isinstance(self, AsyncScheduler):
            raise ValueError(_WRONG_RECORDER[bool(self.scheduler_config.async_scheduling)])
        live = live_socket()  # a bad TRACEVLLM_LIVE_PORT stops the start-up, before anything is written
        self.recording = VllmRecording.start(self.vllm_config, self.kv_cache_manager.block_pool.num_gpu_blocks,
                                             self.block_size)
        self.recorder = self.recording.recorder
        self.observers = self.recording.observers  # also told each request's LlmRequestMessages
        self.waiting_reasons = WaitingReasons(self.waiting, joins_at_tail=self.policy == SchedulingPolicy.FCFS)
        self.trace_ids: dict[str, str] = {}  # vLLM's request id -> the one in the trace, while it lives
        self.trace_headers: dict[str, dict[str, str]] = {}  # vLLM's request id -> its llm_request's, while it lives
        self.used_ids: set[str] = set()  # every id the trace has given a request (they must not repeat)
        self.num_cached_tokens: dict[str, int] = {}  # the prefix-cache hit of each request's first admission
        self.first_token_told: set[str] = set()  # told once (the span keeps the first), not each step after
        self.open_step: ExitStack | None = None
        self.timer: StepTimer | None = None
        self.refused: tuple[Request, KVShortage] | None = None  # the last allocate_slots refused in this step
        self.token_hashes: dict[str, list[bytes]] = {}  # tracevllm's hashes of each request's full blocks
        self.evicted: list[int] = []  # blocks whose hash the allocation in progress made vLLM forget
        self.stored: list[BlocksStored] = []  # recorded once the step's allocations are
        self._watch_allocations()
        self._watch_block_pool()
        self.step_lock = threading.RLock()  # the scheduler between two steps (the module docstring)
        self.live = None if live is None else LivePage(self, live)

    # ---- what vLLM's objects do not say ----------------------------------------------------------

    def _watch_allocations(self) -> None:
        """Wrap vLLM's ``allocate_slots`` (on this instance only): a refusal is kept, with what it lacked."""
        allocate_slots = self.kv_cache_manager.allocate_slots

        def watched(request: Request, num_new_tokens: int, *args, **kwargs):
            new_blocks = allocate_slots(request, num_new_tokens, *args, **kwargs)
            if new_blocks is None:
                self.refused = request, self._shortage(request, num_new_tokens, **kwargs)
            if self.evicted:
                self.recorder.record(BlocksEvicted(self.evicted, self._id(request.request_id)))
                self.evicted = []
            return new_blocks

        self.kv_cache_manager.allocate_slots = watched

    def _watch_block_pool(self) -> None:
        """Wrap vLLM's ``BlockPool.cache_full_blocks`` and its eviction of a cached block (on this
        pool only): what the prefix cache gains and forgets."""
        pool = self.kv_cache_manager.block_pool
        cache_full_blocks, maybe_evict = pool.cache_full_blocks, pool._maybe_evict_cached_block

        def stored(request: Request, blocks, num_cached_blocks: int, num_full_blocks: int, *args, **kwargs) -> None:
            cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
            hashes = self._token_hashes(request)
            new = [(blocks[i].block_id, hashes[i]) for i in range(num_cached_blocks, num_full_blocks)
                   if not blocks[i].is_null and blocks[i].block_hash is not None]
            if new:
                self.stored.append(BlocksStored(self._id(request.request_id), [b for b, _ in new], [h for _, h in new]))

        def evicted(block) -> bool:
            forgotten = maybe_evict(block)
            if forgotten:
                self.evicted.append(block.block_id)
            return forgotten

        pool.cache_full_blocks, pool._maybe_evict_cached_block = stored, evicted

    def _token_hashes(self, request: Request) -> list[bytes]:
        """tracevllm's chained hashes of the request's full blocks so far (extended as it grows)."""
        hashes = self.token_hashes.setdefault(request.request_id, [])
        return hash_new_full_blocks(self.block_size, request.all_token_ids, hashes)

    def _held_block_ids(self, request_id: str) -> list[int]:
        blocks = self.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(request_id, ())
        return [b.block_id for b in blocks]

    def _shortage(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                  new_computed_blocks=None, num_lookahead_tokens: int = 0, full_sequence_must_fit: bool = False,
                  has_scheduled_reqs: bool = True, **_) -> KVShortage:
        """What ``allocate_slots`` lacked: the free blocks it needed beyond the watermark, for the whole
        sequence (``full_sequence_must_fit``) or for the tokens asked. Hit blocks that sit in the free
        queue count as needed: taking them takes free blocks."""
        manager = self.kv_cache_manager
        free = manager.block_pool.get_num_free_blocks()
        reserve = manager.watermark_blocks if has_scheduled_reqs and request.status in _WAITING else 0
        hits = new_computed_blocks.blocks[0] if new_computed_blocks is not None else []
        num_held = len(self._held_block_ids(request.request_id))

        def needed(num_tokens: int) -> int:
            num_blocks = -(-min(num_tokens, self.max_model_len) // self.block_size)
            return num_blocks - num_held - len(hits) + sum(1 for b in hits if b.ref_cnt == 0)

        if full_sequence_must_fit and (whole := needed(request.num_tokens)) + reserve > free:
            return KVShortage(whole, free, True, reserve)
        computed = request.num_computed_tokens + num_new_computed_tokens
        return KVShortage(needed(computed + num_new_tokens + num_lookahead_tokens), free, False, reserve)

    def _id(self, request_id: str) -> str:
        return self.trace_ids.get(request_id, request_id)

    # ---- arrivals and finishes --------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        with self.step_lock:
            self._add_request(request)

    def _add_request(self, request: Request) -> None:
        new = request.request_id not in self.requests  # else: the next chunk of a streaming session
        super().add_request(request)
        if not new:
            return
        now = time.time()
        external = _external_id(request.request_id)
        traced = external if external not in self.used_ids else request.request_id
        self.trace_ids[request.request_id] = traced
        self.used_ids.add(traced)
        headers = self.trace_headers[request.request_id] = new_trace_headers()
        self.observers.on_event(LlmRequestArrived(traced, request.arrival_time, now, request.num_prompt_tokens,
                                                  request.max_tokens, headers))
        self.waiting_reasons.joined()
        params = request.sampling_params
        self.recorder.record(RequestQueued(traced, now, request.num_prompt_tokens, request.priority, headers))
        self.recorder.record(RequestWorkload(
            traced, self.block_size, hash_request_tokens(self.block_size, request.prompt_token_ids or []),
            request.max_tokens, params.min_tokens if params else 0, params.ignore_eos if params else False,
            params is not None and params.prompt_logprobs is not None))

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> list[Request]:
        if request_ids is None:
            ids = list(self.requests)
        else:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        with self.step_lock:
            if any(r.status in _WAITING for i in ids if (r := self.requests.get(i)) is not None):
                self.waiting_reasons.moved()  # taken out of the queue's middle
            return super().finish_requests(None if request_ids is None else ids, finished_status)

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        block_ids = self._held_block_ids(request.request_id)
        result = super()._free_request(request, delay_free_blocks)
        self._record_finished(request, str(request.get_finished_reason() or "abort"), block_ids, time.time())
        return result

    def _record_finished(self, request: Request, reason: str, block_ids: list[int], now: float) -> None:
        """The request is done (or, at shutdown, cut): its blocks freed, its spans closed, its ids forgotten."""
        rid = request.request_id
        traced = self._id(rid)
        self.waiting_reasons.forget(rid)
        if request.num_output_tokens > 0:
            self._first_token(rid, now)  # a request that stopped at its first token
        self.first_token_told.discard(rid)
        if block_ids:
            self.recorder.record(BlocksFreed(traced, block_ids[::-1]))  # vLLM frees the last block first
        num_cached = self.num_cached_tokens.pop(rid, 0)
        self.token_hashes.pop(rid, None)
        self.observers.on_event(LlmRequestFinished(traced, now, reason, request.num_prompt_tokens,
                                                   request.num_output_tokens, num_cached))
        self.recorder.record(RequestFinished(traced, now, reason, request.stop_reason, request.num_output_tokens,
                                             request.num_preemptions, num_cached, block_ids))
        self.trace_ids.pop(rid, None)
        self.trace_headers.pop(rid, None)

    def _first_token(self, rid: str, now: float) -> None:
        if rid not in self.first_token_told:
            self.first_token_told.add(rid)
            self.observers.on_event(LlmRequestFirstToken(self._id(rid), now))

    # ---- one step ---------------------------------------------------------------------------------

    def schedule(self, *args, **kwargs):
        if self.open_step is not None:  # the engine core's last call put its batch in flight and returned
            self._end_step()
        self._start_step()
        try:
            self.refused = None
            now = time.time()
            placeholders = {r.request_id: r.num_output_placeholders for r in self.running if r.num_output_placeholders}
            out = super().schedule(*args, **kwargs)
            self.timer.lap(Stage.SCHEDULE)
            self._record_batch(out, now, placeholders)
            return out
        except BaseException:
            self._end_step()
            raise

    def _start_step(self) -> None:
        """One call of vLLM's engine core begins (its ``step()``, or ``step_with_batch_queue()``): the
        step's record opens, and the lock is taken until it closes."""
        self.step_lock.acquire()
        self.open_step = ExitStack()
        self.timer = self.open_step.enter_context(self.recorder.step())

    def _end_step(self) -> None:
        """The step's record closes, with the gauges as they are: in ``update_from_output``, or, when
        the call only put its batch in flight (a batch queue: asynchronous scheduling, pipeline
        parallelism), at the next call's ``schedule()``, the time since counted as ``execute_model``."""
        if Stage.UPDATE_FROM_OUTPUT not in self.timer.durations:
            self.timer.lap(Stage.EXECUTE_MODEL)
        manager = self.kv_cache_manager
        self.recorder.hold_for_step(StepGauges(
            manager.block_pool.get_num_free_blocks(), manager.block_pool.num_gpu_blocks, manager.usage,
            len(self.running), len(self.waiting)))
        self.open_step.close()  # the StepRecord
        self.open_step = self.timer = None
        self.step_lock.release()

    def _preempt_request(self, request: Request, timestamp: float, *args, **kwargs) -> None:
        block_ids = self._held_block_ids(request.request_id)
        num_lost_tokens, num_output_tokens = request.num_computed_tokens, request.num_output_tokens
        super()._preempt_request(request, timestamp, *args, **kwargs)
        traced = self._id(request.request_id)
        forced_by, shortage = self.refused if self.refused is not None else (request, KVShortage(0, 0))
        self.waiting_reasons.moved()  # put back at the queue's head
        if block_ids:
            self.recorder.record(BlocksFreed(traced, block_ids[::-1]))
        self.recorder.record(RequestPreempted(
            traced, time.time(), num_output_tokens, block_ids, self._id(forced_by.request_id),
            shortage.num_blocks_needed, shortage.num_free_blocks, self.policy.name.lower(), num_lost_tokens))

    def _record_batch(self, out, now: float, placeholders: dict[str, int]) -> None:
        """Admissions, the blocks the running requests gained, the batch, and why the queue waits.
        ``placeholders``: the running requests' tokens in flight before the step (asynchronous
        scheduling), which count as tokens they have."""
        new_blocks = {new.req_id: new.block_ids[0] for new in out.scheduled_new_reqs}
        computed = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
            if cached.new_block_ids[i] is not None and cached.new_block_ids[i][0]:
                new_blocks[rid] = cached.new_block_ids[i][0]
        admitted = set(computed) - set(cached.req_ids) | set(cached.resumed_req_ids)
        scheduled = []
        for rid, n in out.num_scheduled_tokens.items():
            request, traced = self.requests[rid], self._id(rid)
            before = request.num_computed_tokens - n  # vLLM advanced it at the end of schedule()
            if rid in admitted:
                self._admitted(request, traced, n, computed[rid], new_blocks.get(rid, []), now)
            elif rid in new_blocks:
                self.recorder.record(BlocksAllocated(traced, list(new_blocks[rid])))
            in_flight = placeholders.get(rid, 0)
            is_decode = (request.num_output_tokens + in_flight > 0 and n == 1
                         and request.num_tokens + in_flight - before == 1)
            scheduled.append(ScheduledRequest(traced, n, is_decode, before))
        for stored in self.stored:  # after the allocations they follow
            self.recorder.record(stored)
        self.stored = []
        preempted = sorted(self._id(r) for r in out.preempted_req_ids or ())
        self.recorder.hold_for_step(BatchScheduled(scheduled, preempted, self.max_num_scheduled_tokens,
                                                   out.total_num_scheduled_tokens))
        if len(self.waiting):
            self._record_waiting(out, now)

    def _admitted(self, request: Request, traced: str, num_new_tokens: int, num_computed_tokens: int,
                  block_ids: list[int], now: float) -> None:
        """A request left the queue: its prefix-cache hit (the first blocks), the blocks taken for the rest."""
        num_hit = num_computed_tokens // self.block_size
        hit_ids, new_ids = list(block_ids[:num_hit]), list(block_ids[num_hit:])
        self.num_cached_tokens.setdefault(request.request_id, num_computed_tokens)
        self.waiting_reasons.forget(request.request_id)
        self.observers.on_event(LlmRequestScheduled(traced, now))
        if hit_ids:
            self.recorder.record(PrefixCacheHit(traced, hit_ids, num_computed_tokens))
        if new_ids:
            self.recorder.record(BlocksAllocated(traced, new_ids))
        event = RequestResumed if request.num_preemptions > 0 else RequestScheduled
        self.recorder.record(event(traced, now, num_new_tokens, num_computed_tokens, hit_ids, new_ids,
                                   self._lookup(request, num_hit)))

    def _lookup(self, request: Request, num_hit: int) -> PrefixCacheLookup:
        if not self.cache_config.enable_prefix_caching:
            return PrefixCacheLookup(0, 0, "prefix_caching_off")
        if request.sampling_params is not None and request.sampling_params.prompt_logprobs is not None:
            return PrefixCacheLookup(0, 0, "prompt_logprobs")
        num_looked_up = (request.num_tokens - 1) // self.block_size
        if num_hit < num_looked_up:
            return PrefixCacheLookup(num_looked_up, num_hit, "not_cached", self._token_hashes(request)[num_hit])
        return PrefixCacheLookup(num_looked_up, num_hit, "partial_block")

    def _hold_back(self, out) -> HoldBack | None:
        """Why vLLM's admission loop stopped with the queue's head still waiting, in the order it checks."""
        if out.preempted_req_ids:
            return HoldBack("preemption")
        if out.total_num_scheduled_tokens >= self.max_num_scheduled_tokens:
            return HoldBack("token_budget")
        if len(self.running) >= self.max_num_running_reqs:
            return HoldBack("max_num_seqs")
        head = self.waiting.peek_request()
        if self.refused is not None and self.refused[0] is head:
            return HoldBack("kv_cache", self.refused[1])
        if not self.scheduler_config.enable_chunked_prefill:
            return HoldBack("token_budget")  # its prompt is longer than the budget left
        return None

    def _record_waiting(self, out, now: float) -> None:
        hold_back = self._hold_back(out)
        if hold_back is None:
            return
        spent = {self._id(rid): n for rid, n in out.num_scheduled_tokens.items()}
        for waiting in self.waiting_reasons.changed(hold_back, StepBatch(0, now, num_scheduled_tokens=spent)):
            # WaitingReasons keeps vLLM's ids (it compares them with the queue's): the trace gets a copy.
            self.recorder.record(self._traced(waiting))

    def _traced(self, waiting: RequestWaiting) -> RequestWaiting:
        """A copy of a ``RequestWaiting`` kept by ``WaitingReasons`` (in vLLM's ids) in the trace's ids."""
        blocked_by = [self._id(waiting.blocked_by[0])] if waiting.reason == "queued_behind" else waiting.blocked_by
        return msgspec.structs.replace(waiting, request_id=self._id(waiting.request_id), blocked_by=blocked_by)

    def update_from_output(self, scheduler_output, model_runner_output):
        if self.open_step is None:  # a call of the batch queue that schedules nothing, only completes a batch
            self._start_step()
            self.recorder.hold_for_step(BatchScheduled([], [], self.max_num_scheduled_tokens, 0))
        try:
            self.timer.lap(Stage.EXECUTE_MODEL)  # vLLM's execute_model and sample_tokens, and the aborts between
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            now = time.time()
            for rid in scheduler_output.num_scheduled_tokens:
                request = self.requests.get(rid)
                if request is not None and request.num_output_tokens > 0:
                    self._first_token(rid, now)
            self.timer.lap(Stage.UPDATE_FROM_OUTPUT)
        finally:
            self._end_step()
        if not self.has_unfinished_requests():
            self.recorder.record(EngineIdle(now))  # the trace files complete while the caller waits
        return outputs

    def reset_prefix_cache(self, *args, **kwargs) -> bool:
        with self.step_lock:
            cleared = super().reset_prefix_cache(*args, **kwargs)
            if cleared:
                self.recorder.record(AllBlocksCleared())
            return cleared

    def shutdown(self) -> None:
        """vLLM stops with requests unfinished (``vllm serve`` got SIGTERM): each is recorded as aborted
        (its blocks freed), as its caller sees it, so that the trace is whole; then the trace files complete
        and the live page's server stops."""
        with self.step_lock:
            if self.open_step is not None:  # a batch still in flight: the call that scheduled it ends here
                self._end_step()
            now = time.time()
            for rid, request in list(self.requests.items()):
                if not request.is_finished():
                    self._record_finished(request, "abort", self._held_block_ids(rid), now)
            self.recorder.record(EngineIdle(now, shutdown=True))
            self.observers.close()
        if self.live is not None:
            self.live.close()
        super().shutdown()


class TracingAsyncScheduler(TracingScheduler, AsyncScheduler):
    """vLLM's ``AsyncScheduler`` (its default where it schedules asynchronously: on GPUs), recorded as
    ``TracingScheduler`` records the synchronous one: every method above wraps the asynchronous
    scheduler's own (output placeholders, stale outputs after a preemption). vLLM's engine core then
    schedules step N + 1 before it applies step N's output (``step_with_batch_queue``); each of its
    calls is one step of the trace, as in tracevllm's own engine core with ``async_scheduling``: the
    batch it scheduled, and the outputs of the oldest batch, which it applied."""

