"""``tracevllm traces check DIR``: the engine's invariants, checked over a recorded trace.

Each invariant is a function below, named after the rule, its docstring the engine rule it checks.
It reads the loaded trace (``viz/trace_loader.py``): the steps with their replayed block tables, and each
request's ``scheduler.request`` events (admissions, preemptions, the finish, with their step), and
yields its violations in step order. ``check_trace`` reports the earliest one::

    $ tracevllm traces check traces/
    120 steps, 6 requests: 17 invariants hold

    $ tracevllm traces check --verbose traces/
    120 steps, 6 requests: 17 invariants hold
      step_numbers_are_contiguous: Steps are numbered 1, 2, 3 and on, without a gap (EventRecorder.step): ...
      ...

    $ tracevllm traces check broken/
    token_budget_is_respected: step 7, request '3': 33 tokens scheduled, over the token budget of 32
      the rule: A step schedules at most max_num_batched_tokens tokens (the token budget), ...

One rule is found while loading: the loader replays every step's block changes, and a request that
drops a block it does not hold (a reference count below zero) stops the replay
(``viz.blocks.BlockReplayError``); it is reported as ``reference_counts_never_negative``.

The rules read ``Facts`` (``viz/check_facts.py``). A rule whose input the trace lacks (a trace of an
older tracevllm) is skipped: ``max_num_seqs`` and the policy come from the start-up trace
(``EngineCore init``), the stored and evicted blocks from ``step.blocks_stored.*`` and
``step.blocks_evicted.block_ids``, each request's computed tokens from ``step.req_num_computed_tokens``,
the batches in flight from the workers' ``worker.execute_model`` spans.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tracevllm.tracing.schema import STEP_STAGES, Attr, EventName
from viz.blocks import BlockReplayError
from viz.check_facts import ADMITTED, Facts
from viz.trace_loader import load_trace
from viz.model import Step, Trace

APPLIED = STEP_STAGES[-1]  # update_from_output: the stage that applies a batch's output


@dataclass(frozen=True)
class Violation:
    invariant: str
    step: int | None
    request_id: str | None
    detail: str

    def __str__(self) -> str:
        """``invariant: step 7, request '3': what happened``, then the rule's first sentence."""
        where = [f"step {self.step}"] if self.step is not None else []
        where += [f"request {self.request_id!r}"] if self.request_id is not None else []
        return f"{self.invariant}: {', '.join(where)}: {self.detail}\n  the rule: {rule(self.invariant)}"


def _fresh(step: Step, req_id: str) -> list[int]:
    """The blocks ``req_id`` took from the free queue in ``step`` (its allocations that are no prefix hit)."""
    taken = Counter(step.blocks_allocated.get(req_id, ()))
    taken.subtract(step.prefix_hits.get(req_id, ()))
    return list(taken.elements())


# ---- the steps -----------------------------------------------------------------------------------

def step_numbers_are_contiguous(f: Facts) -> Iterator[Violation]:
    """Steps are numbered 1, 2, 3 and on, without a gap (``EventRecorder.step``): a gap is a lost step."""
    for expected, step in enumerate(f.trace.steps, start=1):
        if step.number != expected:
            yield Violation("step_numbers_are_contiguous", expected, None, f"the next step recorded is {step.number}")
            return


def batches_add_up(f: Facts) -> Iterator[Violation]:
    """A step schedules each request at most once, at least one token each, and its total
    (``SchedulerOutput.total_num_scheduled_tokens``) is the sum of the requests' tokens."""
    for step in f.trace.steps:
        for req_id, n in Counter(step.req_ids).items():
            if n > 1:
                yield Violation("batches_add_up", step.number, req_id, f"scheduled {n} times in one step")
        for req_id, n in zip(step.req_ids, step.req_num_tokens):
            if n < 1:
                yield Violation("batches_add_up", step.number, req_id, f"scheduled with {n} tokens")
        if sum(step.req_num_tokens) != step.num_scheduled_tokens:
            yield Violation("batches_add_up", step.number, None, f"the requests' tokens add up to "
                            f"{sum(step.req_num_tokens)}, the step says {step.num_scheduled_tokens}")


def token_budget_is_respected(f: Facts) -> Iterator[Violation]:
    """A step schedules at most ``max_num_batched_tokens`` tokens (the token budget), running requests
    and admissions together."""
    for step in f.trace.steps:
        if step.num_scheduled_tokens > step.token_budget:
            yield Violation("token_budget_is_respected", step.number, step.req_ids[-1] if step.req_ids else None,
                            f"{step.num_scheduled_tokens} tokens scheduled, over the token budget of "
                            f"{step.token_budget}")


def max_num_seqs_is_respected(f: Facts) -> Iterator[Violation]:
    """At most ``max_num_seqs`` requests run at once: in a step's batch, and running after it (the
    scheduler admits a waiting request only while fewer run)."""
    limit = f.startup.get(Attr.MAX_NUM_SEQS)
    if limit is None:
        return
    for step in f.trace.steps:
        if step.batch_size > limit or step.num_running_reqs > limit:
            yield Violation("max_num_seqs_is_respected", step.number, step.req_ids[-1] if step.req_ids else None,
                            f"{step.batch_size} scheduled, {step.num_running_reqs} running after the step, over "
                            f"max_num_seqs={limit}")


def no_admission_in_a_preempting_step(f: Facts) -> Iterator[Violation]:
    """A step that preempts a request admits none (``Scheduler.schedule``: memory is short, so the
    waiting queue waits), and a request preempted in a step is not admitted again in it."""
    admitted = {(e.attributes[Attr.STEP], life.request_id) for life in f.lives.values() for e in life.admissions()}
    by_step: dict[int, list[str]] = {}
    for step, req_id in sorted(admitted):
        by_step.setdefault(step, []).append(req_id)
    for step in f.trace.steps:
        if step.preempted_req_ids and step.number in by_step:
            yield Violation("no_admission_in_a_preempting_step", step.number, by_step[step.number][0],
                            f"admitted while the step preempted {list(step.preempted_req_ids)}")


# ---- the KV blocks ---------------------------------------------------------------------------------

def blocks_in_use_plus_free_is_total(f: Facts) -> Iterator[Violation]:
    """After every step, the blocks some request holds (the replayed block changes), the free blocks
    (the step's gauge, ``BlockPool.get_num_free_blocks``) and the null block (block 0, never held nor
    free; none in a trace of format 3 or older) are every block of the KV cache."""
    null = f.trace.num_null_blocks
    for step in f.trace.steps:
        total = f.startup.get(Attr.NUM_GPU_BLOCKS, step.num_gpu_blocks)
        in_use = len({b for blocks in step.blocks_held.values() for b in blocks})
        if in_use + step.num_free_blocks + null != step.num_gpu_blocks or step.num_gpu_blocks != total:
            yield Violation("blocks_in_use_plus_free_is_total", step.number, None,
                            f"{in_use} blocks held + {step.num_free_blocks} free + {null} null != "
                            f"{step.num_gpu_blocks} (the KV cache has {total})")


def a_request_frees_all_its_blocks(f: Facts) -> Iterator[Violation]:
    """A request gives its blocks back all at once (``KVCacheManager.free``: finished, aborted or
    preempted): after a step in which it drops blocks, it holds none."""
    for step in f.trace.steps:
        for req_id in step.blocks_freed:
            if req_id in step.blocks_held:
                yield Violation("a_request_frees_all_its_blocks", step.number, req_id,
                                f"still holds blocks {list(step.blocks_held[req_id])} after freeing")


def shared_blocks_come_from_prefix_hits(f: Facts) -> Iterator[Violation]:
    """A block held by several requests is shared through the prefix cache: at most one holder took
    it from the free queue (``BlockPool.get_new_blocks``), every other one by a prefix hit."""
    fresh_holders: dict[int, set[str]] = {}
    for step in f.trace.steps:
        for req_id in step.blocks_allocated:
            for block_id in _fresh(step, req_id):
                fresh_holders.setdefault(block_id, set()).add(req_id)
        for req_id, block_ids in step.blocks_freed.items():
            for block_id in block_ids:
                fresh_holders.get(block_id, set()).discard(req_id)
        for block_id, holders in fresh_holders.items():
            if len(holders) > 1:
                yield Violation("shared_blocks_come_from_prefix_hits", step.number, sorted(holders)[-1],
                                f"block {block_id} was handed out by the free queue to {sorted(holders)} at once")
                return


def prefix_hits_take_stored_blocks(f: Facts) -> Iterator[Violation]:
    """A prefix hit takes a block some request stored (``BlockPool.cache_full_blocks``) and that was not
    evicted since (``BlockPool.get_new_blocks`` forgets its hash). Within one step the order is lost:
    a block stored by another request in the same step counts, one the hitting request stores itself
    does not (``allocate_slots`` takes the hit before it stores), and an eviction in the step of a
    store came before it (a reused block is evicted, then stored)."""
    last_stored: dict[int, int] = {}
    evicted: dict[int, int] = {}
    for step in f.trace.steps:
        stored = f.block_changes(step, Attr.STEP_BLOCKS_STORED)
        if stored is None:
            return
        for req_id, block_ids in step.prefix_hits.items():
            for block_id in block_ids:
                by_others = any(block_id in ids for other, ids in stored.items() if other != req_id)
                stored_at = last_stored.get(block_id)
                if by_others or (stored_at is not None and evicted.get(block_id, 0) <= stored_at):
                    continue
                why = "never stored" if stored_at is None else f"evicted at step {evicted[block_id]}"
                yield Violation("prefix_hits_take_stored_blocks", step.number, req_id,
                                f"prefix hit on block {block_id}, {why}")
        for block_ids in stored.values():
            for block_id in block_ids:
                last_stored[block_id] = step.number
        for block_id in f.step_attributes[step.number].get(Attr.STEP_BLOCKS_EVICTED, []):
            if last_stored.get(block_id) != step.number:
                evicted[block_id] = step.number


# ---- the requests ------------------------------------------------------------------------------------

def every_admitted_request_finishes(f: Facts) -> Iterator[Violation]:
    """Every request the engine ran finishes: stopped, at its length, aborted or failed
    (``Scheduler._free_request`` records ``RequestFinished``), so its blocks come back."""
    last_step: dict[str, int] = {}
    for step in f.trace.steps:
        for req_id in step.req_ids:
            last_step[req_id] = step.number
    for req_id, step in sorted(last_step.items(), key=lambda item: item[1]):
        life = f.lives.get(req_id)
        if life is None or life.finish_reason is None:
            yield Violation("every_admitted_request_finishes", step, req_id, "ran, and never finished")


def computed_tokens_match_at_finish(f: Facts) -> Iterator[Violation]:
    """A request's computed tokens match its prompt and outputs at its finish. Computed: the prefix-cache
    hit of its last admission, plus every token scheduled since. Every token but the last output, which
    no step needs to compute: exactly prompt + outputs - 1 when it stops in a step (``length``; ``stop``
    too, unless the front end stopped it while a token was in flight), at most prompt + outputs when
    aborted or failed."""
    chunks: dict[str, list[tuple[int, int]]] = {}
    for step in f.trace.steps:
        for req_id, n in zip(step.req_ids, step.req_num_tokens):
            chunks.setdefault(req_id, []).append((step.number, n))
    ends = {"length": (-1, -1), "stop": (-1, 0)}
    for life in f.lives.values():
        if life.finish_reason is None:
            continue
        admissions = life.admissions()
        if not admissions:
            computed = 0
        else:
            last = admissions[-1].attributes
            computed = last[Attr.NUM_COMPUTED_TOKENS] + sum(
                n for s, n in chunks.get(life.request_id, []) if s >= last[Attr.STEP])
        total = life.num_prompt_tokens + life.num_output_tokens
        low, high = ends.get(life.finish_reason, (-total, 0))
        if not total + low <= computed <= total + high:
            finish_step = max((s for s, _ in chunks.get(life.request_id, [])), default=None)
            yield Violation("computed_tokens_match_at_finish", finish_step, life.request_id,
                            f"finished ({life.finish_reason}) with {computed} tokens computed, for "
                            f"{life.num_prompt_tokens} prompt + {life.num_output_tokens} output tokens")


def computed_tokens_grow_by_what_ran(f: Facts) -> Iterator[Violation]:
    """A request's computed tokens before a step (``step.req_num_computed_tokens``) are its prefix-cache
    hit in the step that admits it, and after that what they were before its previous step plus the
    tokens that step ran: ``Scheduler.schedule`` advances them by what it schedules, and only an
    admission (after a preemption set them back to zero) sets them anew."""
    hits = {(e.attributes[Attr.STEP], life.request_id): e.attributes[Attr.NUM_COMPUTED_TOKENS]
            for life in f.lives.values() for e in life.admissions()}
    computed: dict[str, int] = {}  # each request's, once its last step is over
    for step in f.trace.steps:
        if len(step.req_num_computed_tokens) != len(step.req_ids):
            return
        for req_id, n, before in zip(step.req_ids, step.req_num_tokens, step.req_num_computed_tokens):
            expected = hits.get((step.number, req_id), computed.get(req_id))
            if expected is not None and before != expected:
                yield Violation("computed_tokens_grow_by_what_ran", step.number, req_id,
                                f"{before} tokens computed before the step, {expected} expected")
            computed[req_id] = before + n


def waiting_requests_are_admitted_in_order(f: Facts) -> Iterator[Violation]:
    """Waiting requests are admitted in their queue's order (``core/sched/request_queue.py``). FCFS:
    arrival order, a preempted request back at the front (several preempted in one step keep their
    running order); priority: the lowest priority value first, ties by arrival. Replayed here step by
    step; a waiting spell that ends without an admission (aborted, or the trace ends) is left out,
    which keeps the order of the rest."""
    policy = f.startup.get(Attr.SCHEDULING_POLICY)
    if policy is None:
        return
    spells: set[tuple[str, int]] = set()  # (request, index of its admission that ends the spell)
    for life in f.lives.values():
        spells.update((life.request_id, i) for i in range(len(life.admissions())))
    admitted_at: dict[int, list[str]] = {}
    preempted_at: dict[int, set[str]] = {}
    for life in f.lives.values():
        for e in life.events:
            if e.name in ADMITTED:
                admitted_at.setdefault(e.attributes[Attr.STEP], []).append(life.request_id)
            elif e.name == EventName.PREEMPTED:
                preempted_at.setdefault(e.attributes[Attr.STEP], set()).add(life.request_id)
    arrivals = deque(sorted(f.lives.values(), key=lambda life: life.queued))
    num_admissions: Counter = Counter()
    waiting: list[str] = []
    running: list[str] = []

    def wait(req_id: str, front: bool = False) -> None:
        if (req_id, num_admissions[req_id]) in spells:
            waiting.insert(0, req_id) if front else waiting.append(req_id)

    for step in f.trace.steps:
        while arrivals and arrivals[0].queued < step.start:
            wait(arrivals.popleft().request_id)
        order = {req_id: i for i, req_id in enumerate(step.req_ids)}
        for req_id in sorted(admitted_at.get(step.number, []), key=lambda r: order.get(r, len(order))):
            if policy == "priority":
                waiting.sort(key=lambda r: f.lives[r].order_key)
            if not waiting or waiting[0] != req_id:
                yield Violation("waiting_requests_are_admitted_in_order", step.number, req_id,
                                f"admitted while {waiting[0] if waiting else None!r} was at the head of the "
                                f"waiting queue ({policy})")
                return
            waiting.pop(0)
            num_admissions[req_id] += 1
            running.append(req_id)
        victims = [r for r in running if r in preempted_at.get(step.number, ())]
        for req_id in reversed(victims):  # each goes to the front: the first victim ends up first
            running.remove(req_id)
            wait(req_id, front=True)


def a_waiting_reason_is_recorded_once_per_change(f: Facts) -> Iterator[Violation]:
    """A waiting request records why it waits only when the reason changes
    (``core/sched/waiting_reasons.py``): two ``WAITING`` events in one waiting spell (no admission
    between) differ in their reason, or, for ``queued_behind``, in the request ahead. A listener
    that joins (a page opening the live stream) must not make the engine record them again."""
    for life in f.lives.values():
        last = None
        for e in life.events:
            if e.name in ADMITTED:
                last = None
            elif e.name == EventName.WAITING:
                a = e.attributes
                reason = a[Attr.WAITING_REASON]
                key = (reason, (a.get(Attr.BLOCKED_BY) or [""])[0] if reason == "queued_behind" else "")
                if key == last:
                    yield Violation("a_waiting_reason_is_recorded_once_per_change", a[Attr.STEP], life.request_id,
                                    f"waits for {reason} again, with no admission or other reason between")
                last = key


def no_request_scheduled_while_its_sample_is_in_flight(f: Facts) -> Iterator[Violation]:
    """A request is not scheduled while a batch that samples its next token is in flight. With the
    pipeline's batch queue (``EngineCore.step_with_batch_queue``) a batch runs while later steps
    schedule; one that samples a request's next token (its last prompt chunk, or a decode) must come
    back first, as that token is unknown until then. Earlier prompt chunks may overlap. Scheduling
    asynchronously (``scheduler.async_scheduling``), the request is scheduled on that token's
    placeholder, but on one at most: two batches sampling its tokens are never in flight at once.
    The batches in flight are replayed from the trace: a step whose batch the workers ran sends it
    (``worker.execute_model`` spans), a step that applies an output (``update_from_output``) takes
    back the oldest, as the queue does; without workers the trace does not say when a batch ran,
    and nothing is counted in flight across steps."""
    allowed = 1 if f.startup.get(Attr.ASYNC_SCHEDULING) else 0  # batches sampling it that may still fly
    sent = {run.step for run in f.trace.worker_runs}
    admissions: dict[tuple[int, str], tuple[int, int]] = {}  # (step, request): (tokens known, prefix hit)
    for life in f.lives.values():
        num_outputs = 0  # the outputs a resumed request recomputes
        for e in life.events:
            if e.name == EventName.PREEMPTED:
                num_outputs = e.attributes[Attr.NUM_OUTPUT_TOKENS]
            elif e.name in ADMITTED:
                admissions[(e.attributes[Attr.STEP], life.request_id)] = (
                    life.num_prompt_tokens + num_outputs, e.attributes[Attr.NUM_COMPUTED_TOKENS])
    spells: dict[str, tuple[int, int, int]] = {}  # request: (admission step, tokens known then, computed since)
    in_flight: deque[tuple[int, set[tuple[str, int]]]] = deque()  # (step, {(request, admission step)})
    for step in f.trace.steps:
        sampling = set()
        for req_id, n in zip(step.req_ids, step.req_num_tokens):
            if (step.number, req_id) in admissions:
                spells[req_id] = (step.number, *admissions[(step.number, req_id)])
            admitted, known, computed = spells.get(req_id, (0, 0, 0))
            flying_steps = [flying_step for flying_step, flying in in_flight if (req_id, admitted) in flying]
            if len(flying_steps) > allowed:
                yield Violation("no_request_scheduled_while_its_sample_is_in_flight", step.number, req_id,
                                f"scheduled while step {flying_steps[-1]}'s batch, which samples its next token, "
                                "was in flight" + (" beside another" if allowed else ""))
            spells[req_id] = (admitted, known, computed + n)
            if computed + n >= known:
                sampling.add((req_id, admitted))
        if step.number in sent:
            in_flight.append((step.number, sampling))
        if APPLIED in f.stages.get(step.number, ()) and in_flight:
            in_flight.popleft()


def host_parts_fit_in_their_stage(f: Facts) -> Iterator[Violation]:
    """The model runner's host parts of a stage (``StepRecord.parts``) add up to no more than the
    stage: the runner laps them inside the engine core's lap of the stage (``EngineCore.step``)."""
    for step in f.trace.steps:
        for stage, (stage_ns, parts_ns) in f.stage_parts.get(step.number, {}).items():
            if parts_ns > stage_ns:
                yield Violation("host_parts_fit_in_their_stage", step.number, None,
                                f"the parts of {stage} add up to {parts_ns / 1e6:.3f} ms, the stage took "
                                f"{stage_ns / 1e6:.3f} ms")


Invariant = Callable[[Facts], Iterator[Violation]]
INVARIANTS: tuple[Invariant, ...] = (
    step_numbers_are_contiguous, batches_add_up, token_budget_is_respected, max_num_seqs_is_respected,
    no_admission_in_a_preempting_step, blocks_in_use_plus_free_is_total, a_request_frees_all_its_blocks,
    shared_blocks_come_from_prefix_hits, prefix_hits_take_stored_blocks, every_admitted_request_finishes,
    computed_tokens_match_at_finish, computed_tokens_grow_by_what_ran, waiting_requests_are_admitted_in_order,
    a_waiting_reason_is_recorded_once_per_change, no_request_scheduled_while_its_sample_is_in_flight,
    host_parts_fit_in_their_stage,
)
REPLAYED = "reference_counts_never_negative"
RULES = {invariant.__name__: invariant.__doc__ or "" for invariant in INVARIANTS} | {
    REPLAYED: "A request drops only block references it holds (BlockPool.free_blocks: no block freed twice); "
              "found by the loader's replay of the block changes (viz/blocks.py)."}


def rule(invariant: str) -> str:
    """The invariant's rule in one line: the first sentence of its docstring (``RULES``), plain text."""
    return " ".join(RULES[invariant].replace("``", "").split()).split(". ")[0].rstrip(".") + "."


def check_trace(trace_dir: str) -> tuple[Trace | None, Violation | None]:
    """Load ``trace_dir`` and check every invariant: the trace (None if its block replay broke) and the
    earliest violation in step order (None: all hold). A trace without engine steps (``--trace-level
    request``) has nothing to check. ValueError if the directory cannot be read."""
    try:
        trace = load_trace(trace_dir)
    except BlockReplayError as e:
        return None, Violation(REPLAYED, e.step, e.request_id, f"drops block {e.block_id}, which it does not hold")
    if not trace.steps:
        return trace, None
    facts = Facts.of(trace)
    found = [v for invariant in INVARIANTS if (v := next(invariant(facts), None)) is not None]
    return trace, min(found, key=lambda v: v.step if v.step is not None else 0, default=None)


def main(trace_dir: str, verbose: bool = False) -> int:
    """``tracevllm traces check [--verbose]``: 1 and the first violation, or 0 and a one-line summary,
    with ``verbose`` followed by each invariant and its rule (ValueError for a trace it cannot check)."""
    trace, violation = check_trace(trace_dir)
    if violation is not None:
        print(violation)
        return 1
    steps = trace.require_steps()
    print(f"{len(steps)} steps, {len(trace.requests)} requests: {len(RULES)} invariants hold")
    if verbose:
        print("\n".join(f"  {name}: {rule(name)}" for name in RULES))
    return 0
