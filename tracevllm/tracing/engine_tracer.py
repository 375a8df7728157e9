"""EngineCoreTracer: the engine core's events, as spans of the service ``tracevllm.engine_core``.

It listens to the ``EventRecorder`` (``core/event_recorder.py``) and draws three things:

- **a ``scheduler.request`` span per request**, a child of the front end's ``llm_request`` (through
  the trace headers the request carries), from ``RequestQueued`` until ``RequestFinished``. Its
  events are the request's life: QUEUED, WAITING (why, once per change of reason), SCHEDULED (with
  the prefix-cache hit, and why the lookup stopped there), a prefill.chunk per later prompt chunk,
  PREEMPTED (who needed the blocks, the work lost), RESUMED, FINISHED. Decode steps are not events (512 tokens would
  make 512): the span lists the steps that ran the request instead (``request.steps``). Its
  attributes from the start (``RequestWorkload``) are the request as a replay submits it again:
  its prompt's block hashes and the sampling parameters the scheduler reads.
- **an ``engine_step`` trace per step** (``--trace-level step``) from its ``StepRecord``: the stage
  spans laid end to end from the measured durations (``execute_model`` and ``sample`` with the model
  runner's host parts as children), the batch, the gauges after the step, and the
  KV block changes recorded since the previous step, flattened per request (``schema.BLOCK_CHANGE_KEYS``).
  It links to the ``scheduler.request`` span of every request it ran, and the request lists the
  step, so either leads to the other.
- **the start-up**: ``EngineCore init`` and its phases, under the front end's ``Start engine core``.

It is also the engine core's ``StepContextProvider``: ``step_context()`` gives the running step's
trace context, which the core sends to the workers, so that their spans join the step's trace. On
``EngineIdle`` it completes this process's trace files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Status, StatusCode

from tracevllm.config import ObservabilityConfig
from tracevllm.core.events import (
    AllBlocksCleared, BlocksAllocated, BlocksEvicted, BlocksFreed, BlocksStored, CpuThreadsProbe, EngineEvent, EngineIdle,
    OneTimeCost, PrefixCacheHit, PrefixCacheLookup, RequestFinished, RequestPreempted, RequestQueued, RequestResumed,
    RequestScheduled, RequestWaiting, RequestWorkload, StartupPhase, StepRecord, StepStarted,
)
from tracevllm.tracing.otel import (
    extract_trace_context, flush_all_traces, flush_traces, init_tracer, inject_trace_headers, seconds_to_ns,
)
from tracevllm.tracing.prefix_history import PrefixCacheHistory
from tracevllm.tracing.schema import (
    ENGINE_CORE_PHASES, STEP_PARTS, STEP_STAGES, Attr, EventName, Service, SpanName, block_change_keys,
)


@dataclass
class _RequestSpan:
    span: Span
    steps: list[int] = field(default_factory=list)
    admitted_in_step: int = 0  # the step of its last SCHEDULED / RESUMED event


class EngineCoreTracer:
    def __init__(self, config: ObservabilityConfig, startup_trace_headers: dict[str, str] | None = None) -> None:
        self.tracer = init_tracer(config, Service.ENGINE_CORE)
        self.trace_steps = config.trace_level == "step"
        self.startup_context = extract_trace_context(startup_trace_headers)
        self.requests: dict[str, _RequestSpan] = {}
        self.phases: list[StartupPhase] = []
        self.one_time_costs: list[OneTimeCost] = []  # start-up's, drawn inside their phases
        self.step_costs: list[OneTimeCost] = []  # the running step's
        self.step_probe: CpuThreadsProbe | None = None  # the running step's
        self.step = 1  # the step now running, or the next one to run
        self.step_span: Span | None = None  # the running step's engine_step span (--trace-level step)
        self.in_step = False
        # Requests that finished inside the running step: their spans end with the step's record,
        # once the step is listed among the steps that ran them.
        self.finishing: list[tuple[_RequestSpan, RequestFinished]] = []
        # KV block changes since the last step's record: per kind, per request (see _reset_changes).
        self.changes: dict[str, dict[str, list[int]]] = {}
        self.evicted: list[int] = []
        self._reset_changes()
        self.prefix_history = PrefixCacheHistory()  # to tell why a prefix lookup missed
        self.handlers = {
            RequestQueued: self._queued, RequestWorkload: self._workload, RequestWaiting: self._waiting,
            RequestScheduled: self._scheduled, RequestResumed: self._scheduled, RequestPreempted: self._preempted,
            RequestFinished: self._finished,
            StepStarted: self._step_started, StepRecord: self._step_record, EngineIdle: self._idle,
            StartupPhase: self._startup_phase, OneTimeCost: self._one_time_cost,
            CpuThreadsProbe: self._cpu_threads_probe, BlocksAllocated: self._blocks, PrefixCacheHit: self._blocks,
            BlocksFreed: self._blocks, BlocksStored: self._stored, BlocksEvicted: self._evicted,
            AllBlocksCleared: self.prefix_history.cleared,
        }

    def on_event(self, event: EngineEvent) -> None:
        handler = self.handlers.get(type(event))
        if handler is not None:
            handler(event)

    # ---- requests ------------------------------------------------------------------------------

    def _queued(self, e: RequestQueued) -> None:
        span = self.tracer.start_span(
            SpanName.SCHEDULER_REQUEST, context=extract_trace_context(e.trace_headers),
            start_time=seconds_to_ns(e.timestamp),
            attributes={Attr.REQUEST_ID: e.request_id, Attr.NUM_PROMPT_TOKENS: e.num_prompt_tokens,
                        Attr.PRIORITY: e.priority},
        )
        span.add_event(EventName.QUEUED, timestamp=seconds_to_ns(e.timestamp))
        self.requests[e.request_id] = _RequestSpan(span)

    def _workload(self, e: RequestWorkload) -> None:
        """What the request asked of the scheduler, on its span from the start: the workload a
        replay submits again (``viz/workload.py``)."""
        request = self.requests.get(e.request_id)
        if request is not None:
            request.span.set_attributes({
                Attr.REQUEST_BLOCK_SIZE: e.block_size,
                Attr.PROMPT_BLOCK_HASHES: [h.hex() for h in e.prompt_block_hashes],
                Attr.MAX_TOKENS: e.max_tokens, Attr.MIN_TOKENS: e.min_tokens, Attr.IGNORE_EOS: e.ignore_eos,
                Attr.PROMPT_LOGPROBS: e.prompt_logprobs,
            })

    def _scheduled(self, e: RequestScheduled) -> None:
        request = self.requests.get(e.request_id)
        if request is None:
            return
        request.admitted_in_step = self.step
        name = EventName.RESUMED if isinstance(e, RequestResumed) else EventName.SCHEDULED
        attributes = {
            Attr.STEP: self.step, Attr.NUM_NEW_TOKENS: e.num_new_tokens,
            Attr.NUM_COMPUTED_TOKENS: e.num_computed_tokens, Attr.CACHED_BLOCK_IDS: e.cached_block_ids,
            Attr.BLOCK_IDS: e.block_ids,
        }
        if e.lookup is not None:
            attributes.update(self._lookup_attributes(e.lookup))
        request.span.add_event(name, timestamp=seconds_to_ns(e.timestamp), attributes=attributes)

    def _lookup_attributes(self, lookup: PrefixCacheLookup) -> dict:
        """The lookup, its ``not_cached`` told apart by the block-hash history."""
        attributes = {Attr.PREFIX_NUM_BLOCKS_LOOKED_UP: lookup.num_blocks_looked_up,
                      Attr.PREFIX_NUM_BLOCKS_HIT: lookup.num_blocks_hit, Attr.PREFIX_MISS_REASON: lookup.miss_reason}
        if lookup.miss_reason == "not_cached" and lookup.miss_block_hash is not None:
            cause = self.prefix_history.explain_miss(lookup.miss_block_hash)
            attributes[Attr.PREFIX_MISS_REASON] = cause.reason
            if cause.reason == "evicted":
                attributes[Attr.PREFIX_MISS_EVICTED_STEP] = cause.evicted_step
                attributes[Attr.PREFIX_MISS_EVICTED_FOR] = cause.evicted_for
        return attributes

    def _waiting(self, e: RequestWaiting) -> None:
        request = self.requests.get(e.request_id)
        if request is not None:
            attributes = {Attr.STEP: self.step, Attr.WAITING_REASON: e.reason, Attr.BLOCKED_BY: e.blocked_by}
            if e.reason == "kv_cache":
                attributes.update({Attr.NUM_BLOCKS_NEEDED: e.num_blocks_needed, Attr.NUM_FREE_BLOCKS: e.num_free_blocks,
                                   Attr.FULL_SEQUENCE: e.full_sequence, Attr.NUM_WATERMARK_BLOCKS: e.num_watermark_blocks})
            request.span.add_event(EventName.WAITING, timestamp=seconds_to_ns(e.timestamp), attributes=attributes)

    def _preempted(self, e: RequestPreempted) -> None:
        request = self.requests.get(e.request_id)
        if request is not None:
            request.span.add_event(EventName.PREEMPTED, timestamp=seconds_to_ns(e.timestamp), attributes={
                Attr.STEP: self.step, Attr.NUM_OUTPUT_TOKENS: e.num_output_tokens, Attr.BLOCK_IDS: e.block_ids,
                Attr.FORCED_BY: e.forced_by, Attr.NUM_BLOCKS_NEEDED: e.num_blocks_needed,
                Attr.NUM_FREE_BLOCKS: e.num_free_blocks, Attr.PREEMPTION_POLICY: e.policy,
                Attr.NUM_LOST_TOKENS: e.num_lost_tokens,
            })

    def _finished(self, e: RequestFinished) -> None:
        request = self.requests.pop(e.request_id, None)
        if request is None:
            return
        if self.in_step:
            self.finishing.append((request, e))
        else:
            self._end_request(request, e)

    def _end_request(self, request: _RequestSpan, e: RequestFinished) -> None:
        span, steps = request.span, request.steps
        span.add_event(EventName.FINISHED, timestamp=seconds_to_ns(e.timestamp), attributes={
            Attr.EVENT_FINISH_REASON: e.finish_reason, Attr.BLOCK_IDS: e.block_ids,
        })
        span.set_attributes({
            Attr.NUM_OUTPUT_TOKENS: e.num_output_tokens, Attr.NUM_CACHED_TOKENS: e.num_cached_tokens,
            Attr.NUM_PREEMPTIONS: e.num_preemptions, Attr.FINISH_REASON: e.finish_reason,
            Attr.STEPS: step_ranges(steps), Attr.NUM_STEPS: len(steps),
        })
        if steps:
            span.set_attributes({Attr.FIRST_STEP: steps[0], Attr.LAST_STEP: steps[-1]})
        span.end(end_time=seconds_to_ns(e.timestamp))

    # ---- steps ---------------------------------------------------------------------------------

    def _reset_changes(self) -> None:
        """``allocated``: references taken (new blocks and prefix hits); ``freed``: dropped;
        ``prefix_hits``: the hits alone; ``stored``: blocks that became findable by hash."""
        self.changes = {kind: {} for kind in ("allocated", "freed", "prefix_hits", "stored")}
        self.evicted = []

    def _blocks(self, e: BlocksAllocated | PrefixCacheHit | BlocksFreed | BlocksStored) -> None:
        if not self.trace_steps:
            return
        kinds = {BlocksAllocated: ("allocated",), PrefixCacheHit: ("allocated", "prefix_hits"),
                 BlocksFreed: ("freed",), BlocksStored: ("stored",)}[type(e)]
        for kind in kinds:  # a prefix hit takes references too: it counts as allocated
            self.changes[kind].setdefault(e.request_id, []).extend(e.block_ids)

    def _stored(self, e: BlocksStored) -> None:
        self.prefix_history.stored(e)
        self._blocks(e)

    def _evicted(self, e: BlocksEvicted) -> None:
        self.prefix_history.evicted(e, self.step)
        if self.trace_steps:
            self.evicted.extend(e.block_ids)

    def _step_started(self, e: StepStarted) -> None:
        """Open the step's span now (it is ended from the ``StepRecord``), so that its context can go
        to the workers (``step_context``), whose spans join this trace."""
        self.step, self.in_step = e.step, True
        if self.trace_steps:
            self.step_span = self.tracer.start_span(SpanName.ENGINE_STEP, context=Context(),
                                                    start_time=seconds_to_ns(e.start_time))

    def step_context(self) -> dict[str, str]:
        """The running step's W3C trace context, for its workers (``StepContextProvider``)."""
        return inject_trace_headers(self.step_span) if self.step_span is not None else {}

    def _idle(self, e: EngineIdle) -> None:
        """The engine core has nothing left to do: complete the trace files before its outputs leave;
        when it shuts down, the live exports too (its process may exit without exit hooks)."""
        if e.shutdown:
            flush_all_traces()
        else:
            flush_traces()

    def _one_time_cost(self, cost: OneTimeCost) -> None:
        (self.step_costs if self.in_step else self.one_time_costs).append(cost)

    def _cpu_threads_probe(self, probe: CpuThreadsProbe) -> None:
        self.step_probe = probe

    def _step_record(self, record: StepRecord) -> None:
        self.step, self.in_step = record.step + 1, False
        batch = record.batch
        scheduled = batch.scheduled if batch is not None else []
        finishing = {e.request_id: r for r, e in self.finishing}
        ran = {}  # looked up one by one: self.requests holds every waiting request too, thousands of them
        for s in scheduled:
            request = finishing.get(s.request_id) or self.requests.get(s.request_id)
            if request is None:
                continue
            ran[s.request_id] = request
            request.steps.append(record.step)
            if not s.is_decode and request.admitted_in_step != record.step:
                request.span.add_event(EventName.PREFILL_CHUNK, timestamp=seconds_to_ns(record.start_time),
                                       attributes={Attr.STEP: record.step, Attr.NUM_NEW_TOKENS: s.num_tokens})
        if self.trace_steps:
            self._step_trace(record, [Link(r.span.get_span_context()) for r in ran.values()])
        self.step_costs, self.step_probe = [], None
        self._reset_changes()
        for request, finished in self.finishing:
            self._end_request(request, finished)
        self.finishing = []

    def _step_trace(self, record: StepRecord, links: list[Link]) -> None:
        start = seconds_to_ns(record.start_time)
        end = start + seconds_to_ns(sum(record.durations.values()))
        step_span, self.step_span = self.step_span, None
        step_span.set_attributes(self._step_attributes(record))
        for link in links:
            step_span.add_link(link.context)
        parent = trace.set_span_in_context(step_span)
        for cost in self.step_costs:
            self.tracer.start_span(cost.what, context=parent, start_time=seconds_to_ns(cost.start_time),
                                   attributes={Attr.ONE_TIME_CACHED: cost.cached}).end(end_time=seconds_to_ns(cost.end_time))
        if (probe := self.step_probe) is not None:
            attributes = {Attr.CPU_THREADS_BEFORE: probe.before, Attr.CPU_THREADS_AFTER: probe.after,
                          Attr.CPU_OTHERS_LOAD: probe.others_load, Attr.CPU_THREADS_REASON: probe.reason}
            self.tracer.start_span(SpanName.CPU_THREADS_PROBE, context=parent, start_time=seconds_to_ns(probe.start_time),
                                   attributes=attributes).end(end_time=seconds_to_ns(probe.end_time))
        stage_start = start
        for stage in STEP_STAGES:
            if stage in record.durations:
                stage_end = stage_start + seconds_to_ns(record.durations[stage])
                stage_span = self.tracer.start_span(stage, context=parent, start_time=stage_start)
                if stage == SpanName.EXECUTE_MODEL and record.forward_device_s is not None:
                    stage_span.set_attribute(Attr.FORWARD_DEVICE_TIME, record.forward_device_s)
                self._part_spans(record, stage, stage_span, stage_start)
                stage_span.end(end_time=stage_end)
                stage_start = stage_end
        if record.error is not None:
            step_span.set_status(Status(StatusCode.ERROR, record.error))
        step_span.end(end_time=end)

    def _part_spans(self, record: StepRecord, stage: str, stage_span: Span, start: int) -> None:
        """The model runner's host parts of ``stage``, children of its span, laid end to end from its
        start: what the stage took beyond them (the executor's messages) shows as a gap at its end."""
        context = trace.set_span_in_context(stage_span)
        for part in STEP_PARTS.get(stage, ()):
            if part in record.parts:
                end = start + seconds_to_ns(record.parts[part])
                self.tracer.start_span(part, context=context, start_time=start).end(end_time=end)
                start = end

    def _step_attributes(self, record: StepRecord) -> dict:
        attributes: dict = {Attr.STEP_NUMBER: record.step}
        if self.step_costs:
            attributes[Attr.STEP_ONE_TIME_COSTS] = [c.what for c in self.step_costs]
            attributes[Attr.STEP_ONE_TIME_COST_SECONDS] = [c.end_time - c.start_time for c in self.step_costs]
        if self.step_probe is not None:
            attributes[Attr.STEP_CPU_THREADS_PROBE_SECONDS] = self.step_probe.end_time - self.step_probe.start_time
            attributes[Attr.CPU_THREADS] = self.step_probe.after
        if record.batch is not None:
            b = record.batch
            attributes.update({
                Attr.STEP_BATCH_SIZE: len(b.scheduled), Attr.STEP_NUM_SCHEDULED_TOKENS: b.num_scheduled_tokens,
                Attr.STEP_TOKEN_BUDGET: b.token_budget,
                Attr.STEP_NUM_PREFILL_TOKENS: sum(s.num_tokens for s in b.scheduled if not s.is_decode),
                Attr.STEP_NUM_DECODE_TOKENS: sum(s.num_tokens for s in b.scheduled if s.is_decode),
                Attr.STEP_REQ_IDS: [s.request_id for s in b.scheduled],
                Attr.STEP_REQ_NUM_TOKENS: [s.num_tokens for s in b.scheduled],
                Attr.STEP_REQ_IS_DECODE: [s.is_decode for s in b.scheduled],
                Attr.STEP_REQ_NUM_COMPUTED_TOKENS: [s.num_computed_tokens for s in b.scheduled],
                Attr.STEP_PREEMPTED_REQ_IDS: b.preempted_request_ids,
            })
        if record.gauges is not None:
            g = record.gauges
            attributes.update({
                Attr.STEP_NUM_FREE_BLOCKS: g.num_free_blocks, Attr.STEP_NUM_GPU_BLOCKS: g.num_gpu_blocks,
                Attr.STEP_KV_CACHE_USAGE: g.kv_cache_usage, Attr.STEP_NUM_RUNNING_REQS: g.num_running_reqs,
                Attr.STEP_NUM_WAITING_REQS: g.num_waiting_reqs,
            })
        prefixes = {"allocated": Attr.STEP_BLOCKS_ALLOCATED, "freed": Attr.STEP_BLOCKS_FREED,
                    "prefix_hits": Attr.STEP_PREFIX_HITS, "stored": Attr.STEP_BLOCKS_STORED}
        for kind, prefix in prefixes.items():
            tables = self.changes[kind]
            req_ids_key, num_key, block_ids_key = block_change_keys(prefix)
            attributes[req_ids_key] = list(tables)
            attributes[num_key] = [len(ids) for ids in tables.values()]
            attributes[block_ids_key] = [b for ids in tables.values() for b in ids]
        attributes[Attr.STEP_BLOCKS_EVICTED] = self.evicted
        return attributes

    # ---- start-up ------------------------------------------------------------------------------

    def _startup_phase(self, phase: StartupPhase) -> None:
        """Phases end before the whole start-up does: keep them until ``EngineCore init`` ends."""
        if phase.name in ENGINE_CORE_PHASES:
            self.phases.append(phase)
            return
        root = self.tracer.start_span(phase.name, context=self.startup_context,
                                      start_time=seconds_to_ns(phase.start_time), attributes=phase.attributes)
        context = trace.set_span_in_context(root)
        children = {}
        for child in self.phases:
            children[child.name] = span = self.tracer.start_span(
                child.name, context=context, start_time=seconds_to_ns(child.start_time), attributes=child.attributes)
            span.end(end_time=seconds_to_ns(child.end_time))
        for cost in self.one_time_costs:  # inside the phase it ran in
            parent = next((children[p.name] for p in self.phases if p.start_time <= cost.start_time <= p.end_time), root)
            self.tracer.start_span(cost.what, context=trace.set_span_in_context(parent),
                                   start_time=seconds_to_ns(cost.start_time),
                                   attributes={Attr.ONE_TIME_CACHED: cost.cached}).end(end_time=seconds_to_ns(cost.end_time))
        root.end(end_time=seconds_to_ns(phase.end_time))
        self.phases, self.one_time_costs = [], []


def step_ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 7, 8]`` as ``"1-3, 7-8"``: short enough to read at 512 steps."""
    ranges: list[list[int]] = []
    for step in steps:
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges)
