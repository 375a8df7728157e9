"""A golden schedule (``tracevllm/parity/golden.py``: vLLM's own steps, recorded) read as a ``Trace``.

So that what reads a trace can read vLLM's run: ``tracevllm traces diff DIR GOLDEN`` holds a tracevllm
run of the golden's workload (``tracevllm parity GOLDEN --trace-out DIR``) against vLLM's, step by
step. A golden has the steps and the requests' fates but none of a trace's spans, so the trace is
built from the steps themselves, replayed in order::

    added before step k          queued at step k's start
    admitted in step k           Admission at step k's start (its prefix-cache hit: the first blocks)
    scheduled in step k          a Chunk of step k; the step samples the request's next token when
                                 its computed tokens reach its length (first token: step k's end)
    preempted in step k          a preemption at step k's start; its blocks freed
    finished in step k           finished at step k's end; aborted before step k: at its start

Times are vLLM's (seconds since its first step began). vLLM records no reasons, so its requests carry
no ``WAITING`` events, and its preemptions no cause: ``traces diff`` says only what vLLM did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracevllm.parity.golden import GoldenSchedule, load_golden
from tracevllm.tracing.schema import NULL_BLOCK_FORMAT
from viz.model import Admission, Chunk, PrefixHit, Request, Step, Trace
from viz.segments import request_segments


@dataclass
class _Life:
    """One request, followed step by step."""

    num_prompt_tokens: int
    queued: float
    num_outputs: int = 0
    num_computed: int = 0
    first_token: float | None = None
    finished: float | None = None
    finish_reason: str | None = None
    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[float] = field(default_factory=list)
    prefix_hits: list[PrefixHit] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    running: bool = False


def golden_trace(golden: GoldenSchedule) -> Trace:
    """The golden as a trace: its steps and its requests, by the golden's request ids."""
    by_id = golden.request_by_id
    block_size, num_blocks = golden.options["block_size"], golden.options["num_gpu_blocks_override"]
    lives: dict[str, _Life] = {}
    steps = []
    for s in golden.steps:
        freed: dict[str, tuple[int, ...]] = {}
        for rid in s.added:
            lives[rid] = _Life(len(by_id[rid].prompt_token_ids), s.start)
        for rid in s.aborted:
            life = lives[rid]
            freed[rid] = tuple(reversed(life.blocks))
            life.blocks, life.running, life.finished, life.finish_reason = [], False, s.start, "abort"
        for a in s.admitted:
            life = lives[a.request_id]
            life.admissions.append(Admission(s.start, life.num_prompt_tokens + life.num_outputs, a.num_cached_tokens,
                                             a.resumed, s.number))
            hit = tuple(s.new_block_ids.get(a.request_id, ())[:a.num_cached_tokens // block_size])
            if hit:
                life.prefix_hits.append(PrefixHit(s.start, hit, a.num_cached_tokens))
            life.running = True
        for rid in s.preempted:
            life = lives[rid]
            life.preemptions.append(s.start)
            freed[rid] = tuple(reversed(life.blocks))
            life.blocks, life.running, life.num_computed = [], False, 0
        is_decode = []
        for rid, n in s.scheduled.items():
            life = lives[rid]
            life.blocks += s.new_block_ids.get(rid, [])
            behind = life.num_prompt_tokens + life.num_outputs - s.num_computed_tokens[rid]
            is_decode.append(life.num_outputs > 0 and n == 1 and behind == 1)
            life.chunks.append(Chunk(s.number, s.start, s.end, n, is_decode[-1]))
            life.num_computed = s.num_computed_tokens[rid] + n
            if life.num_computed >= life.num_prompt_tokens + life.num_outputs:  # the step samples its next token
                life.num_outputs += 1
                life.first_token = s.end if life.first_token is None else life.first_token
        for rid, reason in s.finished.items():
            life = lives[rid]
            freed[rid] = tuple(reversed(life.blocks))
            life.blocks, life.running, life.finished, life.finish_reason = [], False, s.end, reason
        held = {rid: tuple(life.blocks) for rid, life in lives.items() if life.blocks}
        steps.append(Step(
            s.number, s.start, s.end, tuple(s.scheduled), tuple(s.scheduled.values()), tuple(is_decode),
            tuple(s.preempted), golden.options["max_num_batched_tokens"], sum(s.scheduled.values()),
            s.num_free_blocks, num_blocks, 1.0 - s.num_free_blocks / (num_blocks - 1),
            sum(life.running for life in lives.values()),
            sum(not life.running and life.finished is None for life in lives.values()),
            {rid: tuple(ids) for rid, ids in s.new_block_ids.items()}, freed,
            {a.request_id: tuple(s.new_block_ids[a.request_id][:a.num_cached_tokens // block_size])
             for a in s.admitted if a.num_cached_tokens}, held,
            tuple(s.num_computed_tokens[rid] for rid in s.scheduled)))
    end = golden.steps[-1].end if golden.steps else 0.0
    requests = {rid: _request(rid, life, by_id[rid].parent_id, end) for rid, life in lives.items()}
    return Trace(golden.path, 0, (), requests, tuple(steps), declared_format=NULL_BLOCK_FORMAT)


def _request(request_id: str, life: _Life, parent_id: str | None, end: float) -> Request:
    finished = life.finished if life.finished is not None else end
    first_token = life.first_token
    ttft = None if first_token is None else first_token - life.queued
    first_admission = life.admissions[0].time if life.admissions else None
    return Request(
        request_id=request_id, trace_id="", num_prompt_tokens=life.num_prompt_tokens,
        num_output_tokens=life.num_outputs, num_preemptions=len(life.preemptions), finish_reason=life.finish_reason,
        arrival=life.queued, queued=life.queued, finished=finished, first_token=first_token,
        admissions=tuple(life.admissions), preemptions=tuple(life.preemptions), prefix_hits=tuple(life.prefix_hits),
        chunks=tuple(life.chunks),
        segments=request_segments(life.queued, [a.time for a in life.admissions], life.preemptions, finished,
                                  first_token, life.chunks),
        time_in_queue=None if first_admission is None else first_admission - life.queued, ttft=ttft,
        e2e=finished - life.queued, decode_time=None if first_token is None else finished - first_token,
        parent_request_id=parent_id)


def load_golden_trace(path: str) -> Trace:
    """A golden schedule file as a trace (ValueError naming the file and the field for a bad one)."""
    return golden_trace(load_golden(path))
