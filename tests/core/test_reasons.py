"""Why, not only what: the scheduler's reasons for holding a request back (``RequestWaiting``), for
a preemption (``RequestPreempted``) and for where a prefix-cache lookup stopped (``PrefixCacheLookup``,
told apart by ``tracing/prefix_history.py``), on the scheduler alone."""

from __future__ import annotations

from tests.core.test_scheduler import make_request, make_scheduler, run_step
from tracevllm.request import RequestStatus
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import (
    AllBlocksCleared, BlocksEvicted, BlocksStored, RequestPreempted, RequestResumed, RequestScheduled,
    RequestWaiting,
)
from tracevllm.tracing.prefix_history import PrefixCacheHistory


class Events:
    """An observer that keeps every event, and a prefix history fed the way the tracer feeds it."""

    def __init__(self) -> None:
        self.events: list = []
        self.step = 1
        self.history = PrefixCacheHistory()

    def on_event(self, event) -> None:
        self.events.append(event)
        if isinstance(event, BlocksStored):
            self.history.stored(event)
        elif isinstance(event, BlocksEvicted):
            self.history.evicted(event, self.step)
        elif isinstance(event, AllBlocksCleared):
            self.history.cleared(event)

    def of(self, kind, request_id=None) -> list:
        return [e for e in self.events if isinstance(e, kind) and (request_id is None or e.request_id == request_id)]


def observed(**kwargs):
    s = make_scheduler(**kwargs)
    events = Events()
    recorder = EventRecorder([events])
    s.recorder = s.kv_cache_manager.recorder = s.kv_cache_manager.block_pool.recorder = recorder
    return s, events


def steps(s, events, n):
    for _ in range(n):
        run_step(s)
        events.step += 1


def test_short_requests_wait_for_the_budget_a_long_prompt_spends_and_say_so_once():
    s, events = observed(budget=128)
    long = make_request(1000, max_tokens=2)
    shorts = [make_request(20, max_tokens=2) for _ in range(4)]
    for r in [long, *shorts]:
        s.add_request(r)
    steps(s, events, 5)  # 1,000 tokens at 128 a step: the long prompt takes every step's whole budget
    assert s.num_waiting_by_reason == {"token_budget": 1, "queued_behind": 3}
    (head,) = events.of(RequestWaiting, shorts[0].request_id)  # one record, not one per step
    assert head.reason == "token_budget" and head.blocked_by == [long.request_id]
    for ahead, short in zip(shorts, shorts[1:]):  # admission is in queue order: the others wait for it
        (waiting,) = events.of(RequestWaiting, short.request_id)
        assert waiting.reason == "queued_behind" and waiting.blocked_by == [ahead.request_id]
    steps(s, events, 6)
    assert all(events.of(RequestScheduled, r.request_id) for r in shorts)
    assert s.num_waiting_by_reason == {}


def test_a_queue_records_a_few_reasons_a_request_however_often_the_heads_reason_changes():
    """200 requests behind max_num_seqs=4 and a budget the running decodes and a prefill share: the
    head's reason flips between the spent budget and max_num_seqs hundreds of times, and each
    flip is one record (the head's), not one per waiting request."""
    s, events = observed(budget=24, max_num_seqs=4, num_blocks=1000)
    requests = [make_request(20 + i % 7, max_tokens=3 + i % 5, ignore_eos=True) for i in range(200)]
    for r in requests:
        s.add_request(r)
    num_steps = 0
    while s.has_unfinished_requests():
        steps(s, events, 1)
        num_steps += 1
    waits = events.of(RequestWaiting)
    head_reasons = [w.reason for w in waits if w.reason != "queued_behind"]
    assert {"token_budget", "max_num_seqs"} <= set(head_reasons) and len(head_reasons) > 200
    assert len(waits) <= 2 * len(requests) + len(head_reasons)
    for ahead, r in zip(requests[4:], requests[5:]):  # behind the one before it, recorded once while behind
        assert [w.blocked_by for w in events.of(RequestWaiting, r.request_id) if w.reason == "queued_behind"] \
            == [[ahead.request_id]]


def test_under_the_priority_policy_each_request_is_behind_the_one_before_it_in_priority_order():
    s, events = observed(max_num_seqs=1, policy="priority")
    first = make_request(10, max_tokens=20, ignore_eos=True, priority=0)
    low, mid = make_request(10, priority=5), make_request(10, priority=3)
    for r in (first, low, mid):
        s.add_request(r)
    steps(s, events, 3)  # steps with nobody joining: only the head is looked at
    assert [(w.request_id, w.reason, w.blocked_by) for w in events.of(RequestWaiting)] == [
        (mid.request_id, "max_num_seqs", []), (low.request_id, "queued_behind", [mid.request_id])]
    urgent = make_request(10, priority=1)  # inserted in front of mid: both record their new place
    s.add_request(urgent)
    steps(s, events, 1)
    assert [(w.request_id, w.reason) for w in events.of(RequestWaiting)][2:] == [
        (urgent.request_id, "max_num_seqs"), (mid.request_id, "queued_behind")]
    assert events.of(RequestWaiting, mid.request_id)[-1].blocked_by == [urgent.request_id]


def test_a_request_behind_an_aborted_or_preempted_one_records_its_new_neighbour():
    s, events = observed(max_num_seqs=1)
    first, a, b, c = (make_request(10, max_tokens=50, ignore_eos=True) for _ in range(4))
    for r in (first, a, b, c):
        s.add_request(r)
    steps(s, events, 1)
    assert [(w.request_id, w.reason) for w in events.of(RequestWaiting)] == [
        (a.request_id, "max_num_seqs"), (b.request_id, "queued_behind"), (c.request_id, "queued_behind")]
    s.finish_requests(b.request_id, RequestStatus.FINISHED_ABORTED)  # out of the middle: c is now behind a
    steps(s, events, 1)
    assert events.of(RequestWaiting, c.request_id)[-1].blocked_by == [a.request_id]
    assert len(events.of(RequestWaiting)) == 4
    s.waiting_reasons.forget_all()  # a new listener: everyone waiting says why again at the next step
    steps(s, events, 1)
    assert [(w.request_id, w.reason) for w in events.of(RequestWaiting)][4:] == [
        (a.request_id, "max_num_seqs"), (c.request_id, "queued_behind")]

    s, events = observed(num_blocks=5, block_size=4, max_num_seqs=2)  # 4 blocks and the null block
    big, small = (make_request(6, max_tokens=20, ignore_eos=True) for _ in range(2))
    behind = make_request(6)
    for r in (big, small, behind):
        s.add_request(r)
    while not events.of(RequestPreempted):  # big and small grow until one is put back in front of behind
        steps(s, events, 1)
    (preempted,) = events.of(RequestPreempted)
    assert events.of(RequestWaiting, preempted.request_id)[-1].reason == "preemption"
    assert events.of(RequestWaiting, behind.request_id)[-1].blocked_by == [preempted.request_id]


def test_max_num_seqs_and_a_head_that_does_not_fit_in_the_kv_cache():
    s, events = observed(max_num_seqs=1)
    first, second = make_request(10), make_request(10)
    s.add_request(first)
    s.add_request(second)
    steps(s, events, 1)
    assert [e.reason for e in events.of(RequestWaiting, second.request_id)] == ["max_num_seqs"]

    s, events = observed(num_blocks=5, block_size=16)  # 4 blocks and the null block
    big, small, tiny = make_request(60, max_tokens=40), make_request(60), make_request(4)
    for r in (big, small, tiny):
        s.add_request(r)
    steps(s, events, 1)  # big takes all 4 blocks: small needs 4, none are free; tiny waits behind it
    (head,) = events.of(RequestWaiting, small.request_id)
    assert (head.reason, head.num_blocks_needed, head.num_free_blocks) == ("kv_cache", 4, 0)
    assert head.full_sequence  # the blocks its whole prompt needs (scheduler_reserve_full_isl)
    (behind,) = events.of(RequestWaiting, tiny.request_id)
    assert behind.reason == "queued_behind" and behind.blocked_by == [small.request_id]
    assert s.num_waiting_by_reason == {"kv_cache": 1, "queued_behind": 1}


def test_a_preemption_names_who_needed_the_blocks_and_the_work_lost():
    s, events = observed(num_blocks=6, block_size=4)  # 5 blocks and the null block
    # a holds 2 blocks, b 3: a's first decode needs a third block, and none is free
    a, b = make_request(8, max_tokens=8, ignore_eos=True), make_request(11, max_tokens=4, ignore_eos=True)
    s.add_request(a)
    s.add_request(b)
    while not events.of(RequestPreempted):
        steps(s, events, 1)
    (preempted,) = events.of(RequestPreempted)
    assert preempted.request_id == b.request_id and preempted.forced_by == a.request_id
    assert preempted.policy == "fcfs" and preempted.num_blocks_needed == 1 and preempted.num_free_blocks == 0
    # b had computed its 11 prompt tokens and its outputs but the last one sampled
    assert preempted.num_lost_tokens == 11 + preempted.num_output_tokens - 1
    assert events.of(RequestWaiting, b.request_id)[0].reason == "preemption"
    while not events.of(RequestResumed, b.request_id):
        steps(s, events, 1)
    (resumed,) = events.of(RequestResumed, b.request_id)
    # what was lost is computed again, but for what the prefix cache still held
    assert resumed.num_computed_tokens + resumed.num_new_tokens == 11 + preempted.num_output_tokens
    assert resumed.num_computed_tokens <= preempted.num_lost_tokens


def test_three_prefix_misses_each_with_its_reason():
    s, events = observed(num_blocks=9, block_size=4)  # 8 blocks and the null block
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks and a partial one
    first = make_request(prompt=prompt, max_tokens=1)
    s.add_request(first)
    steps(s, events, 2)
    (lookup,) = [e.lookup for e in events.of(RequestScheduled, first.request_id)]
    assert (lookup.miss_reason, events.history.explain_miss(lookup.miss_block_hash).reason) == ("not_cached",
                                                                                               "never_stored")

    again = make_request(prompt=prompt, max_tokens=1)  # both full blocks hit: what is left is partial
    s.add_request(again)
    steps(s, events, 2)
    (lookup,) = [e.lookup for e in events.of(RequestScheduled, again.request_id)]
    assert (lookup.num_blocks_looked_up, lookup.num_blocks_hit, lookup.miss_reason) == (2, 2, "partial_block")

    evictor = make_request(prompt=list(range(500, 532)), max_tokens=1)  # 8 blocks: every cached one goes
    s.add_request(evictor)
    steps(s, events, 2)
    third = make_request(prompt=prompt, max_tokens=1)
    s.add_request(third)
    steps(s, events, 1)
    (lookup,) = [e.lookup for e in events.of(RequestScheduled, third.request_id)]
    cause = events.history.explain_miss(lookup.miss_block_hash)
    assert (lookup.num_blocks_hit, cause.reason, cause.evicted_for) == (0, "evicted", evictor.request_id)
    assert cause.evicted_step == 5


def test_nothing_is_recorded_unobserved_but_the_gauge_still_counts():
    s = make_scheduler(budget=16)
    reqs = [make_request(40) for _ in range(3)]
    for r in reqs:
        s.add_request(r)
    run_step(s)
    assert s.num_waiting_by_reason == {"token_budget": 1, "queued_behind": 1}
    assert all(getattr(e, "lookup", None) is None for r in reqs for e in r.events)
    assert s.make_stats().num_waiting_reqs_by_reason == {"token_budget": 1, "queued_behind": 1}


def test_the_trace_schema_names_every_reason():
    """``tracing/schema.py`` holds plain constants (viz reads it without the engine): its lists
    must be the engine's own."""
    from typing import get_args

    from tracevllm.core.events import PrefixMissReason, WaitingReason
    from tracevllm.tracing.schema import PREFIX_MISS_REASONS, WAITING_REASONS

    assert WAITING_REASONS == get_args(WaitingReason)
    engine_reasons = set(get_args(PrefixMissReason)) - {"not_cached"}
    assert engine_reasons | {"never_stored", "evicted", "cleared"} == set(PREFIX_MISS_REASONS)
