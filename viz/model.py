"""The loaded trace as plain typed objects: spans, requests, engine steps.

Times on ``Request`` and ``Step`` are seconds since ``Trace.t0_ns`` (the earliest start of a span
that is not part of the start-up trace), so a notebook can plot them as they are; ``Span`` keeps the
files' nanoseconds.

A request's life, as ``Request.segments`` draws it::

    arrival  queued         admitted                          preempted     admitted again      finished
       |------|=== queued ===|== prefill ==|=== decode ===|X|== preempted ==|== prefill ==|= decode =|
                                           ^ first token (TTFT)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tracevllm.tracing.schema import NULL_BLOCK_FORMAT

SegmentKind = Literal["queued", "prefill", "decode", "preempted"]


@dataclass(frozen=True, slots=True)
class Process:
    """The process that emitted a span (from its OTLP resource)."""

    pid: int
    name: str  # ``tracevllm.process``: MainProcess or EngineCore
    service: str
    trace_format: int = 1  # ``tracevllm.trace_format`` (``schema.TRACE_FORMAT``); 1 before it was declared


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Span:
    """One span of a trace file, attributes decoded to Python values (OTLP's string int64s as ints)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...]
    process: Process


@dataclass(frozen=True, slots=True)
class Admission:
    """A ``SCHEDULED`` (or ``RESUMED``) event: the request left the waiting queue (first time, or after
    a preemption) in engine step ``step``. ``miss_reason`` says why the prefix-cache lookup stopped
    where it did (``schema.PREFIX_MISS_REASONS``; None in traces older than the reasons)."""

    time: float
    num_tokens: int  # what the prefix cache was asked for: the prompt, plus the outputs before a preemption
    num_computed_tokens: int  # tokens found in the prefix cache
    resumed: bool
    step: int = 0
    num_blocks_looked_up: int = 0
    num_blocks_hit: int = 0
    miss_reason: str | None = None
    miss_evicted_step: int | None = None  # for "evicted": when, and for which request
    miss_evicted_for: str | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """A ``WAITING`` event: from ``time`` (engine step ``step``) the request waits for ``reason``, until
    it is admitted or another reason is recorded (``schema.WAITING_REASONS``)."""

    time: float
    step: int
    reason: str
    blocked_by: tuple[str, ...]
    num_blocks_needed: int
    num_free_blocks: int
    full_sequence: bool = False  # kv_cache: the blocks needed are the whole prompt's (scheduler_reserve_full_isl)
    num_watermark_blocks: int = 0  # kv_cache: the free blocks the watermark keeps


@dataclass(frozen=True, slots=True)
class Preemption:
    """A ``PREEMPTED`` event: in step ``step``, ``forced_by`` needed ``num_blocks_needed`` blocks with
    ``num_free_blocks`` free; the request lost the KV of ``num_lost_tokens`` tokens."""

    time: float
    step: int
    forced_by: str
    num_blocks_needed: int
    num_free_blocks: int
    policy: str
    num_lost_tokens: int


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Blocks the request took from the prefix cache when admitted (its admission's ``cached_block_ids``)."""

    time: float
    block_ids: tuple[int, ...]
    num_cached_tokens: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """The request's share of one engine step (empty at ``--trace-level request``)."""

    step: int
    start: float
    end: float
    num_tokens: int
    is_decode: bool


@dataclass(frozen=True, slots=True)
class Segment:
    kind: SegmentKind
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Request:
    """One engine-core request: its ``scheduler.request`` span, joined to its ``llm_request`` root.

    Latencies come from the root (None when the root is missing, e.g. a process killed mid-run).
    ``cached_tokens`` is the prefix-cache hit of the first admission, which is what the engine
    reports as the request's ``num_cached_tokens``.
    """

    request_id: str
    trace_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    finish_reason: str | None
    arrival: float
    queued: float
    finished: float
    first_token: float | None
    admissions: tuple[Admission, ...]
    preemptions: tuple[float, ...]
    prefix_hits: tuple[PrefixHit, ...]
    chunks: tuple[Chunk, ...]
    segments: tuple[Segment, ...]
    time_in_queue: float | None
    ttft: float | None
    e2e: float | None
    decode_time: float | None
    waits: tuple[Wait, ...] = ()
    preempted: tuple[Preemption, ...] = ()  # the preemptions with their causes (``preemptions``: the times)
    # The user's request (its llm_request, ``gen_ai.request.id``), whose n samples are engine-core requests.
    parent_request_id: str | None = None
    n: int = 1

    @property
    def cached_tokens(self) -> int:
        return self.admissions[0].num_computed_tokens if self.admissions else 0

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (decode time / (output tokens - 1)), as vLLM counts it."""
        if self.decode_time is None or self.num_output_tokens < 2:
            return None
        return self.decode_time / (self.num_output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Step:
    """One ``engine_step`` span, with the KV blocks each request holds once the step is over.

    ``blocks_held`` replays every step's ``blocks_allocated`` and ``blocks_freed`` from the first
    (``viz/blocks.py``); a block held by several requests is shared through the prefix cache.
    ``prefix_hits`` are the blocks taken from the prefix cache during this step (a subset of
    ``blocks_allocated``), from the step's ``step.prefix_hits.*``.
    """

    number: int
    start: float
    end: float
    req_ids: tuple[str, ...]
    req_num_tokens: tuple[int, ...]
    req_is_decode: tuple[bool, ...]
    preempted_req_ids: tuple[str, ...]
    token_budget: int
    num_scheduled_tokens: int
    num_free_blocks: int
    num_gpu_blocks: int
    kv_cache_usage: float
    num_running_reqs: int
    num_waiting_reqs: int
    blocks_allocated: dict[str, tuple[int, ...]]
    blocks_freed: dict[str, tuple[int, ...]]
    prefix_hits: dict[str, tuple[int, ...]]
    blocks_held: dict[str, tuple[int, ...]]
    # Each request's tokens whose KV it had before the step (empty in traces of format 1).
    req_num_computed_tokens: tuple[int, ...] = ()
    # What the step paid once (e.g. "torch.compile"), with the seconds of each: not the batch's cost.
    one_time_costs: tuple[tuple[str, float], ...] = ()
    # The seconds the step spent measuring the CPU thread count again (cpu_threads.probe), before its batch.
    cpu_threads_probe_seconds: float = 0.0

    @property
    def is_batch_cost_only(self) -> bool:
        """The step's time is its batch's: it paid no one-time cost and measured no thread count (what
        the step-cost fits learn from)."""
        return not self.one_time_costs and not self.cpu_threads_probe_seconds

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for n, d in zip(self.req_num_tokens, self.req_is_decode) if not d)

    @property
    def num_decode_tokens(self) -> int:
        return sum(n for n, d in zip(self.req_num_tokens, self.req_is_decode) if d)

    @property
    def block_owners(self) -> dict[int, tuple[str, ...]]:
        """Each block in use after the step, with the requests holding it (its reference count is the length)."""
        owners: dict[int, list[str]] = {}
        for req_id, block_ids in self.blocks_held.items():
            for block_id in block_ids:
                owners.setdefault(block_id, []).append(req_id)
        return {b: tuple(reqs) for b, reqs in sorted(owners.items())}


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """One rank's ``worker.execute_model`` of one batch (tensor or pipeline parallelism).

    ``step`` is the engine step that scheduled the batch (with the pipeline's batch queue, the batch
    runs while later steps do). ``recv`` and ``send`` are the seconds spent waiting for the previous
    stage's tensors at the start and handing them on at the end; ``comm`` all communication."""

    rank: int
    tp_rank: int
    pp_rank: int
    step: int | None
    start: float
    end: float
    num_tokens: int
    recv: float
    send: float
    comm: float


@dataclass(frozen=True)
class Trace:
    """A ``--trace-out`` directory, loaded: every span, the requests by engine-core id (in arrival
    order) and the engine steps (in step order; none at ``--trace-level request``)."""

    directory: str
    t0_ns: int
    spans: tuple[Span, ...]
    requests: dict[str, Request]
    steps: tuple[Step, ...]
    worker_runs: tuple[WorkerRun, ...] = ()  # in start order; none when one process ran the model
    # The format of a trace built from another record than spans (a golden schedule: tracevllm/parity/golden_trace.py).
    declared_format: int | None = None

    @property
    def trace_format(self) -> int:
        """The oldest trace format among the spans' processes (``schema.TRACE_FORMAT``), or the
        declared one."""
        if self.declared_format is not None:
            return self.declared_format
        return min((s.process.trace_format for s in self.spans), default=1)

    @property
    def num_null_blocks(self) -> int:
        """Blocks of the KV cache that are never held and never free: block 0, vLLM's null block, in
        traces of format 4 or later (``schema.NULL_BLOCK_FORMAT``); none before."""
        return 1 if self.trace_format >= NULL_BLOCK_FORMAT else 0

    @property
    def has_steps(self) -> bool:
        return bool(self.steps)

    def require_steps(self) -> tuple[Step, ...]:
        """The steps, or a ValueError saying why a step-based view has nothing to show."""
        if not self.steps:
            raise ValueError(
                f"{self.directory}: no engine_step spans (recorded with --trace-level request?): "
                "step-based views need --trace-level step, the default"
            )
        return self.steps
