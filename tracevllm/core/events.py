"""The engine core narrates itself: typed events, one ``msgspec`` struct per thing that happened.

The scheduler, the KV cache manager, the block pool and ``EngineCore.step()`` record what they
decide as these structs; they never build spans or metrics themselves. Observers (the OpenTelemetry
tracer in ``tracevllm/tracing/``, the server's live stream ``engine/event_publisher.py``, a test, a
notebook) receive every event in order, through the engine core's ``EventRecorder``
(``core/event_recorder.py``)::

    Scheduler ─────────── RequestQueued (and RequestWorkload), RequestWaiting, RequestScheduled /
    (sched/scheduler.py)  RequestResumed, RequestPreempted, RequestFinished
    KVCacheManager ────── BlocksAllocated, PrefixCacheHit, BlocksFreed, BlocksStored
    BlockPool ─────────── BlocksEvicted, AllBlocksCleared
    EngineCore ────────── StepStarted, StepRecord (one per step), StartupPhase, EngineIdle
    Worker ────────────── WorkerStepRecord, EngineIdle (in each worker's process, to its own observers)

A step's record is assembled from three parts, each told by the one who knows it: the scheduler's
``BatchScheduled`` (who runs, with how many tokens) and ``StepGauges`` (KV blocks and queues after
the step), and the step's own clock (the four stages' durations, ``core/stages.py``, and the model
runner's host parts inside two of them).

The request events also travel to the front end (``EngineCoreOutput.events``), always: they are
what ``RequestStateStats`` (queue time, TTFT, ...) is computed from, one per change of a request's
state, never one per token. ``RequestWaiting`` and ``RequestWorkload`` are the exceptions: they are
recorded only when observed, and reach only the observers (the tracer, the live stream), not the
front end.
"""

from __future__ import annotations

from typing import Literal

import msgspec

FinishReasonName = Literal["stop", "length", "abort", "error"]  # str(FinishReason)


# ---- a request's life in the engine core (these also reach the front end) ----------------------

class RequestQueued(msgspec.Struct, tag=True, array_like=True):
    request_id: str
    timestamp: float
    num_prompt_tokens: int
    priority: int
    trace_headers: dict[str, str] | None = None  # W3C traceparent of the front end's llm_request


class RequestWorkload(msgspec.Struct, tag=True, array_like=True):
    """What was asked of the scheduler for a request, recorded with its ``RequestQueued`` (when
    observed): enough for a replay (``viz/workload.py``) to submit it again to a ``Scheduler`` and
    see the same prefix-cache hits, without the tokens.

    ``prompt_block_hashes`` are the hashes of the prompt's full blocks of ``block_size`` tokens,
    chained as the KV cache manager chains them (``kv_cache_utils.hash_request_tokens``), hashed for
    this even when prefix caching is off. ``max_tokens`` is the processor's (a request's None
    becomes "up to max_model_len"); ``prompt_logprobs``: it asked for them, so it skips the prefix
    cache. The priority is on ``RequestQueued``; ``n`` is the front end's (each sample is a request
    of its own here)."""

    request_id: str
    block_size: int
    prompt_block_hashes: list[bytes]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    prompt_logprobs: bool


# Why a request waits (``RequestWaiting.reason``). The queue's head waits for one of the first five,
# what stopped the step's admissions; every other request waits ``queued_behind`` the one just ahead
# of it, since admission is in queue order (``core/sched/waiting_reasons.py``). Under FCFS the
# request ahead came earlier; under the priority policy it has a higher priority (a lower number) or
# came earlier at the same one.
WaitingReason = Literal[
    "token_budget",  # this step's max_num_batched_tokens went to others (``blocked_by``: the largest)
    "max_num_seqs",  # max_num_seqs requests already run
    "kv_cache",  # KV blocks were short: it needs ``num_blocks_needed`` (its whole prompt: ``full_sequence``), and
    #              ``num_free_blocks`` are free, ``num_watermark_blocks`` of which must stay free
    "preemption",  # a running request was preempted this step: nobody is admitted while memory is short
    "in_flight",  # its last scheduled tokens have not come back yet (pipeline parallelism's batch queue)
    "queued_behind",  # not the head: the request just ahead of it in the queue (``blocked_by``) waits too
]
# Why a prefix-cache lookup stopped where it did (``PrefixCacheLookup.miss_reason``).
PrefixMissReason = Literal[
    "partial_block",  # every full block was found: what is left is less than a block (or the last token)
    "not_cached",  # the first missing block's hash is not in the cache: never stored, evicted or cleared
    "prefix_caching_off",  # enable_prefix_caching=False
    "prompt_logprobs",  # the request skips the cache: prompt logprobs need every prompt position's logits
]


class PrefixCacheLookup(msgspec.Struct, array_like=True):
    """An admission's prefix-cache lookup: ``num_blocks_hit`` of the ``num_blocks_looked_up`` full
    blocks it may take (all but a last token) were found, and why it stopped there. For
    ``not_cached``, ``miss_block_hash`` is the first missing block's hash: an observer that keeps the
    hashes of ``BlocksStored`` and ``BlocksEvicted`` tells "never stored" from "evicted at step s to
    make room for request r" (``tracing/prefix_history.py``); the engine keeps no history."""

    num_blocks_looked_up: int
    num_blocks_hit: int
    miss_reason: PrefixMissReason
    miss_block_hash: bytes | None = None


class RequestWaiting(msgspec.Struct, tag=True, array_like=True):
    """A step left the waiting request unscheduled, and why. Recorded when the request's reason
    changes (another ``reason``, or ``queued_behind`` another request), never once per step: it
    holds until the request is scheduled or records another. ``blocked_by`` and the block counts are
    as they were when it was recorded. For ``kv_cache``: ``full_sequence`` when the blocks needed are
    those of its whole prompt (``scheduler_reserve_full_isl``: it is admitted only when all of it fits),
    and ``num_watermark_blocks`` the free blocks an admission must leave (the watermark)."""

    request_id: str
    timestamp: float
    reason: WaitingReason
    blocked_by: list[str] = []  # token_budget: the largest spenders of the step; queued_behind: the request ahead
    num_blocks_needed: int = 0  # kv_cache
    num_free_blocks: int = 0  # kv_cache
    full_sequence: bool = False  # kv_cache
    num_watermark_blocks: int = 0  # kv_cache


class RequestScheduled(msgspec.Struct, tag=True, array_like=True):
    """The request left the waiting queue and runs: ``num_computed_tokens`` of it were found in the
    prefix cache (``cached_block_ids``; ``lookup`` says how far the lookup got and why it stopped),
    ``num_new_tokens`` are computed this step (``block_ids``: the blocks newly allocated for them)."""

    request_id: str
    timestamp: float
    num_new_tokens: int
    num_computed_tokens: int
    cached_block_ids: list[int]
    block_ids: list[int]
    lookup: PrefixCacheLookup | None = None


class RequestResumed(RequestScheduled, tag=True):
    """Scheduled again after a preemption: its tokens are recomputed (except prefix-cache hits)."""


class RequestPreempted(msgspec.Struct, tag=True, array_like=True):
    """Blocks ran out: the request lost its KV blocks (``block_ids``) and waits again.

    ``forced_by`` is the running request whose ``allocate_slots`` found ``num_blocks_needed`` blocks
    short with ``num_free_blocks`` free (the victim itself, when it was the last one left); ``policy``
    chose the victim (fcfs: the newest running request; priority: the lowest priority, then the
    newest). ``num_lost_tokens``: the tokens whose KV it had, to be computed again unless the prefix
    cache still holds them when it resumes."""

    request_id: str
    timestamp: float
    num_output_tokens: int
    block_ids: list[int]
    forced_by: str = ""
    num_blocks_needed: int = 0
    num_free_blocks: int = 0
    policy: str = "fcfs"
    num_lost_tokens: int = 0


class RequestFinished(msgspec.Struct, tag=True, array_like=True):
    """The request is done and its blocks (``block_ids``) are freed."""

    request_id: str
    timestamp: float
    finish_reason: FinishReasonName
    stop_reason: int | str | None
    num_output_tokens: int
    num_preemptions: int
    num_cached_tokens: int
    block_ids: list[int]


RequestEvent = (RequestQueued | RequestWorkload | RequestWaiting | RequestScheduled | RequestResumed | RequestPreempted
                | RequestFinished)


# ---- KV blocks -------------------------------------------------------------------------------

class BlocksAllocated(msgspec.Struct, tag=True, array_like=True):
    """Blocks taken from the free queue for ``request_id`` (each now has one reference)."""

    request_id: str
    block_ids: list[int]


class PrefixCacheHit(msgspec.Struct, tag=True, array_like=True):
    """Cached blocks ``request_id`` shares instead of computing them (each gains a reference)."""

    request_id: str
    block_ids: list[int]
    num_cached_tokens: int


class BlocksFreed(msgspec.Struct, tag=True, array_like=True):
    """``request_id`` dropped its references (finished, aborted or preempted), in the order the
    blocks join the free queue."""

    request_id: str
    block_ids: list[int]


class BlocksStored(msgspec.Struct, tag=True, array_like=True):
    """Blocks of ``request_id`` that became full and can now be found by their hash (``block_hashes``,
    one per block)."""

    request_id: str
    block_ids: list[int]
    block_hashes: list[bytes] = []


class BlocksEvicted(msgspec.Struct, tag=True, array_like=True):
    """Cached blocks whose hash was forgotten because the free queue handed them out again, to
    ``request_id``."""

    block_ids: list[int]
    request_id: str = ""


class AllBlocksCleared(msgspec.Struct, tag=True, array_like=True):
    """``reset_prefix_cache``: no block can be found by its hash any more."""


KVCacheEvent = BlocksAllocated | PrefixCacheHit | BlocksFreed | BlocksStored | BlocksEvicted | AllBlocksCleared


# ---- one engine step ------------------------------------------------------------------------

class ScheduledRequest(msgspec.Struct, array_like=True):
    request_id: str
    num_tokens: int
    is_decode: bool  # computes the one token it is behind, after its first output; else a prefill
    num_computed_tokens: int  # tokens whose KV it had before the step: its new tokens attend to them


class BatchScheduled(msgspec.Struct, tag=True, array_like=True):
    """The scheduler's decision for one step, in the batch's order (held for the ``StepRecord``)."""

    scheduled: list[ScheduledRequest]
    preempted_request_ids: list[str]
    token_budget: int
    num_scheduled_tokens: int


class StepGauges(msgspec.Struct, tag=True, array_like=True):
    """The scheduler's state once a step's outputs are applied (held for the ``StepRecord``)."""

    num_free_blocks: int
    num_gpu_blocks: int
    kv_cache_usage: float
    num_running_reqs: int
    num_waiting_reqs: int


class StepStarted(msgspec.Struct, tag=True, array_like=True):
    """A step begins: the events until its ``StepRecord`` happen inside it."""

    step: int
    start_time: float


class EngineIdle(msgspec.Struct, tag=True, array_like=True):
    """The engine core has nothing left to do: the step that just ended (or the aborts just applied)
    left no unfinished request, or the core shuts down. It is recorded before the step's outputs
    leave, so an observer that
    buffers (the tracer, its trace files) completes its output while the caller still waits: a trace
    read right after ``generate`` is whole. The workers record one too (``Worker.record_engine_idle``).
    ``shutdown``: nothing will follow (the core shuts down)."""

    timestamp: float
    shutdown: bool = False


class WorkerStepRecord(msgspec.Struct, tag=True, array_like=True):
    """One rank's ``execute_model`` of one batch, recorded by its Worker (in the worker's process).

    ``recv_time_s``: waiting for the previous pipeline stage's tensors (before the forward);
    ``send_time_s``: handing them to the next stage (after it); ``comm_time_s``: all of this rank's
    communication in the call, those two and the tensor-parallel all-reduces and gathers. On CPU
    (gloo) these are waits; on CUDA (NCCL) only the launches, which return before the GPU is done.
    """

    rank: int
    tp_rank: int
    pp_rank: int
    start_time: float
    end_time: float
    num_tokens: int
    recv_time_s: float
    send_time_s: float
    comm_time_s: float
    step_context: dict[str, str] | None  # from the engine core's observers: SchedulerOutput.step_context


class StepRecord(msgspec.Struct, tag=True, array_like=True):
    """One ``EngineCore.step()``: when it ran, how long each stage took, what it ran, what it left."""

    step: int
    start_time: float  # wall clock (time.time())
    durations: dict[str, float]  # seconds per stage (core/stages.py): schedule, execute_model, ...
    batch: BatchScheduled | None
    gauges: StepGauges | None
    error: str | None = None  # the exception that ended the step, if one did
    # The model runner's host path, seconds per part (core/stages.py: StepPart, STEP_PARTS), inside
    # execute_model and sample; empty when the step did not lap them (pipeline parallelism).
    parts: dict[str, float] = {}
    forward_device_s: float | None = None  # CUDA: the device's time for the forward and the logits


class StartupPhase(msgspec.Struct, tag=True, array_like=True):
    """A phase of the engine core's start-up (``stages.Phase``), or the whole of it; ``attributes``
    are what the phase learned (keys: ``stages.PhaseAttr``)."""

    name: str
    start_time: float
    end_time: float
    attributes: dict[str, str | bool | int | float] = {}


class OneTimeCost(msgspec.Struct, tag=True, array_like=True):
    """Something a process does once and then reuses: a C++ op built (or, ``cached``, loaded from the
    machine's build cache), recorded by whoever did it (``worker/one_time_costs.py``). At start-up
    the tracer draws it inside the phase it ran in, so a slow start names what it paid for."""

    what: str  # e.g. "C++ op cpu_norm_act"
    start_time: float
    end_time: float
    cached: bool  # reused from an earlier process on this machine (loaded, not built)


class CpuThreadsProbe(msgspec.Struct, tag=True, array_like=True):
    """The worker measured its CPU thread count again, before a step, because other processes' load
    on its cores changed (``worker/cpu_thread_follower.py``); the step paid for the measurement."""

    start_time: float
    end_time: float
    before: int  # torch threads before the probe
    after: int  # ... and after it (the same when the probe kept the count)
    others_load: float  # cores' worth other processes used in the window that set the probe off
    reason: str


EngineEvent = (RequestEvent | KVCacheEvent | StepStarted | StepRecord | StartupPhase | OneTimeCost | EngineIdle
               | WorkerStepRecord | CpuThreadsProbe)
