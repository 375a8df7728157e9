"""A server-scale trace built as viz model objects, without an engine: ``synthetic_trace()`` runs a
toy scheduler over 100 requests (most in one burst, at most 64 running) and a 2,000-block cache for
500 steps.

The toy keeps the rules the pictures rely on: a free block queue taken from the head and given back
at the tail (so a run touches only part of a big cache), requests of one "system prompt" group
sharing their first blocks through the prefix cache while an earlier member still holds them, and a
preemption now and then (the newest running request gives back its blocks and waits again).

It has the spans a single-process run writes, drawn from those requests and steps: per request an
``llm_request`` with ``tokenize``, ``scheduler.request`` (and its events), ``prefill``, ``decode`` and
``detokenize`` under it; per step an ``engine_step`` with its four stages.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass, field

from tracevllm.tracing.schema import STEP_STAGES, Attr, EventName, Service, SpanName
from viz.model import (Admission, Chunk, PrefixHit, Process, Request, Segment, Span, SpanEvent, Step, Trace,
                       WorkerRun)

BLOCK_SIZE = 16
STEP_TIME = 0.02
SHARED_BLOCKS = 2  # the prefix a group's requests share


@dataclass
class _Live:
    req_id: str
    group: int
    arrival_step: int
    prompt: int
    output: int
    blocks: list[int] = field(default_factory=list)
    hit: tuple[int, ...] = ()
    computed: int = 0
    generated: int = 0
    admitted_step: int = -1
    first_token_step: int = -1
    segments: list[tuple[str, int, int]] = field(default_factory=list)  # kind, first step, last step
    admissions: list[Admission] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    preemptions: list[float] = field(default_factory=list)
    waiting_since: int = 0


def _time(step: int) -> float:
    return step * STEP_TIME


def synthetic_trace(num_requests: int = 100, num_blocks: int = 2000, num_steps: int = 500, seed: int = 0) -> Trace:
    rng = random.Random(seed)
    burst = num_requests * 3 // 4  # arrive at once, as from a benchmark client: more than 64 wait
    arrivals = sorted([rng.randrange(0, num_steps // 25) for _ in range(burst)]
                      + [rng.randrange(0, int(num_steps * 0.8)) for _ in range(num_requests - burst)])
    pending = deque(_Live(f"cmpl-{rng.getrandbits(128):032x}-0", rng.randrange(4), a, rng.randrange(32, 200),
                          rng.randrange(16, 110), waiting_since=a) for a in arrivals)
    free = deque(range(num_blocks))
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    done: list[_Live] = []
    held: dict[str, tuple[int, ...]] = {}
    steps: list[Step] = []
    for number in range(1, num_steps + 1):
        while pending and pending[0].arrival_step <= number:
            waiting.append(pending.popleft())
        before = dict(held)
        preempted: list[str] = []
        if number % 97 == 0 and running:  # the newest running request gives its blocks back
            victim = running.pop()
            free.extend(victim.blocks)
            victim.segments += [("prefill", victim.admitted_step, victim.admitted_step + 1),
                                ("decode", victim.admitted_step + 1, number)]
            victim.blocks, victim.computed = [], 0
            victim.segments.append(("preempted", number, number))
            victim.preemptions.append(_time(number))
            victim.waiting_since = number
            waiting.appendleft(victim)
            preempted.append(victim.req_id)
        hits: dict[str, tuple[int, ...]] = {}
        while waiting and len(running) < 64:
            req = waiting[0]
            donor = next((r for r in running if r.group == req.group and len(r.blocks) >= SHARED_BLOCKS), None)
            shared = donor.blocks[:SHARED_BLOCKS] if donor else []
            need = -(-(req.prompt + req.output) // BLOCK_SIZE) - len(shared)
            if need > len(free):
                break
            waiting.popleft()
            req.blocks = shared + [free.popleft() for _ in range(need)]
            if shared:
                hits[req.req_id] = tuple(shared)
                req.hit = req.hit or tuple(shared)
            req.computed = len(shared) * BLOCK_SIZE
            kind = "queued" if not req.preemptions else "preempted"
            req.segments.append((kind, req.waiting_since, number))
            req.admissions.append(Admission(_time(number), req.prompt + req.generated, req.computed,
                                            bool(req.preemptions)))
            req.admitted_step = number
            running.append(req)
        req_ids, nums, decodes = [], [], []
        for req in list(running):
            total = req.prompt + req.generated
            n = total - req.computed  # the whole prompt at admission, then the last sampled token
            is_decode = req.generated > 0 and n == 1
            req.computed += n
            req.generated += 1
            req_ids.append(req.req_id), nums.append(n), decodes.append(is_decode)
            req.chunks.append(Chunk(number, _time(number), _time(number) + STEP_TIME * 0.9, n, is_decode))
            if req.first_token_step < 0:
                req.first_token_step = number
            if req.generated >= req.output:
                running.remove(req)
                free.extend(reversed(req.blocks))
                done.append(req)
        held = {r.req_id: tuple(r.blocks) for r in running}
        in_use = len({b for blocks in held.values() for b in blocks})
        taken = {r: tuple(b for b in blocks if b not in before.get(r, ())) for r, blocks in held.items()}
        dropped = {r: blocks for r, blocks in before.items() if r not in held}
        steps.append(Step(number, _time(number), _time(number) + STEP_TIME * 0.9, tuple(req_ids), tuple(nums),
                          tuple(decodes), tuple(preempted), 2048, sum(nums), num_blocks - in_use, num_blocks,
                          in_use / num_blocks, len(running), len(waiting),
                          {r: b for r, b in taken.items() if b}, dropped, hits, held))
    requests = {}
    for req in sorted(done + running + list(waiting) + list(pending), key=lambda r: (r.arrival_step, r.req_id)):
        requests[req.req_id] = _request(req, num_steps)
    ids = (f"{i:016x}" for i in itertools.count(1))
    spans = [span for r in requests.values() for span in _request_spans(r, ids)]
    spans += [span for step in steps for span in _step_spans(step, ids)]
    return Trace("synthetic", 0, tuple(sorted(spans, key=lambda s: s.start_ns)), requests, tuple(steps),
                 _worker_runs(steps))


FRONT_END = Process(1, "MainProcess", Service.FRONTEND)
ENGINE_CORE = Process(1, "MainProcess", Service.ENGINE_CORE)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _request_spans(r: Request, ids) -> list[Span]:
    root = Span(SpanName.LLM_REQUEST, r.trace_id, next(ids), None, _ns(r.arrival), _ns(r.finished), {}, (), FRONT_END)
    events = [(EventName.QUEUED, r.queued)] + [(EventName.SCHEDULED, a.time) for a in r.admissions]
    events += [(EventName.PREEMPTED, t) for t in r.preemptions] + [(EventName.FINISHED, r.finished)]
    events = tuple(SpanEvent(name, _ns(t), {}) for name, t in sorted(events, key=lambda e: e[1]))
    sched = Span(SpanName.SCHEDULER_REQUEST, r.trace_id, next(ids), root.span_id, _ns(r.queued), _ns(r.finished),
                 {Attr.REQUEST_ID: r.request_id}, events, ENGINE_CORE)
    phases = [(SpanName.TOKENIZE, r.arrival, r.arrival + 0.001)]
    if r.first_token is not None:
        phases += [(SpanName.PREFILL, r.admissions[0].time, r.first_token),
                   (SpanName.DECODE, r.first_token, r.finished), (SpanName.DETOKENIZE, r.first_token, r.finished)]
    return [root, sched] + [Span(name, r.trace_id, next(ids), root.span_id, _ns(a), _ns(b), {}, (), FRONT_END)
                            for name, a, b in phases]


def _step_spans(step: Step, ids) -> list[Span]:
    trace_id = f"{step.number:032x}"
    span = Span(SpanName.ENGINE_STEP, trace_id, next(ids), None, _ns(step.start), _ns(step.end),
                {Attr.STEP_NUMBER: step.number}, (), ENGINE_CORE)
    cuts = [step.start + (step.end - step.start) * f for f in (0, 0.05, 0.9, 0.95, 1.0)]  # execute_model: most
    return [span] + [Span(stage, trace_id, next(ids), span.span_id, _ns(a), _ns(b), {}, (), ENGINE_CORE)
                     for stage, a, b in zip(STEP_STAGES, cuts, cuts[1:])]


def _worker_runs(steps: list[Step]) -> tuple[WorkerRun, ...]:
    """tp=2 x pp=2 running every step's batch as a pipeline: stage 0 in the step's first half, stage
    1 (after a short wait for stage 0's tensors) in its second half and the next step's first."""
    runs = []
    for step in steps:
        length = step.end - step.start
        for rank, (tp_rank, pp_rank) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
            start = step.start + pp_rank * length / 2
            recv = 0.1 * length if pp_rank else 0.0
            runs.append(WorkerRun(rank, tp_rank, pp_rank, step.number, start, start + length, step.num_scheduled_tokens,
                                  recv, 0.02 * length, recv + 0.1 * length))
    return tuple(runs)


def _request(req: _Live, num_steps: int) -> Request:
    finished = req.generated >= req.output
    end_step = req.chunks[-1].step if req.chunks else num_steps
    segments = [Segment(kind, _time(a), _time(b)) for kind, a, b in req.segments if b > a]
    if req.admitted_step > 0:
        start = req.admitted_step
        segments.append(Segment("prefill", _time(start), _time(start) + STEP_TIME))
        if end_step > start:
            segments.append(Segment("decode", _time(start) + STEP_TIME, _time(end_step) + STEP_TIME))
    arrival = _time(req.arrival_step)
    first_token = _time(req.first_token_step) + STEP_TIME if req.first_token_step > 0 else None
    end = _time(end_step) + STEP_TIME
    return Request(
        request_id=req.req_id, trace_id=req.req_id.split("-")[1], num_prompt_tokens=req.prompt,
        num_output_tokens=req.generated,
        num_preemptions=len(req.preemptions), finish_reason="length" if finished else None, arrival=arrival,
        queued=arrival, finished=end, first_token=first_token, admissions=tuple(req.admissions),
        preemptions=tuple(req.preemptions),
        prefix_hits=(PrefixHit(req.admissions[0].time, req.hit, req.admissions[0].num_computed_tokens),)
        if req.admissions and req.admissions[0].num_computed_tokens else (),
        chunks=tuple(req.chunks), segments=tuple(sorted(segments, key=lambda s: s.start)),
        time_in_queue=(req.admissions[0].time - arrival) if req.admissions else None,
        ttft=(first_token - arrival) if first_token is not None else None,
        e2e=(end - arrival) if finished else None,
        decode_time=(end - first_token) if finished and first_token is not None else None)
