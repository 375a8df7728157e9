"""The waiting queues: FCFS order with prepend and removal from the middle; priority order with
lazily removed entries."""

from __future__ import annotations

import random

from tracevllm.core.sched.request_queue import FCFSRequestQueue, PriorityRequestQueue
from tracevllm.request import Request
from tracevllm.sampling_params import SamplingParams


def make_request(i: int, priority: int = 0) -> Request:
    return Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=1), 2, arrival_time=float(i), priority=priority)


def ids(queue) -> list[str]:
    return [r.request_id for r in queue]


def test_fcfs_order_prepend_and_remove_from_the_middle():
    q = FCFSRequestQueue()
    reqs = [make_request(i) for i in range(5)]
    for r in reqs:
        q.add_request(r)
    assert ids(q) == ["r0", "r1", "r2", "r3", "r4"] and len(q) == 5
    q.remove_request(reqs[2])
    assert ids(q) == ["r0", "r1", "r3", "r4"]
    assert q.pop_request() is reqs[0]
    q.prepend_request(reqs[0])  # preempted: back to the front
    assert q.peek_request() is reqs[0] and ids(q) == ["r0", "r1", "r3", "r4"]
    q.remove_request(reqs[4])
    q.remove_request(reqs[0])
    assert [q.pop_request(), q.pop_request()] == [reqs[1], reqs[3]] and len(q) == 0
    q.add_request(reqs[2])  # a request id may come back once its request is gone
    assert ids(q) == ["r2"]


def test_priority_order_with_lazily_removed_entries():
    q = PriorityRequestQueue()
    reqs = [make_request(i, priority=p) for i, p in enumerate([3, 1, 2, 1, 0, 2])]
    for r in reqs:
        q.add_request(r)
    assert ids(q) == ["r4", "r1", "r3", "r2", "r5", "r0"]
    q.remove_request(reqs[4])  # the head
    q.remove_request(reqs[2])  # the middle
    assert len(q) == 4 and ids(q) == ["r1", "r3", "r5", "r0"]
    assert q.peek_request() is reqs[1]
    assert q.pop_request() is reqs[1]
    q.prepend_request(reqs[1])  # preempted: placed by its priority
    q.add_request(reqs[2])  # removed, then queued again: in its place, once
    assert ids(q) == ["r1", "r3", "r2", "r5", "r0"] and len(q) == 5
    assert [q.pop_request() for _ in range(5)] == [reqs[1], reqs[3], reqs[2], reqs[5], reqs[0]]
    assert len(q) == 0


def test_priority_queue_matches_a_sorted_list_under_random_removals():
    rng = random.Random(0)
    q, live = PriorityRequestQueue(), []
    for i in range(2000):
        r = make_request(i, priority=rng.randrange(5))
        q.add_request(r)
        live.append(r)
        if rng.random() < 0.4:
            victim = live.pop(rng.randrange(len(live)))
            q.remove_request(victim)
        if rng.random() < 0.2:
            head = min(live)
            assert q.pop_request() is head
            live.remove(head)
        assert len(q) == len(live)
    assert len(q._heap) <= 2 * len(live) + 1  # removed entries are purged as they pile up
    assert [q.pop_request() for _ in range(len(live))] == sorted(live)
