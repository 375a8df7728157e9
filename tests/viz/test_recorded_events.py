"""tracevllm/entrypoints/ui/recorded_events.py tells a recorded run again as the engine's events (what
``tracevllm traces view`` streams): the steps in order without gaps, each request's life in order, and block events that,
replayed from the first, give at every step record the block tables the engine itself had."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tracevllm.core.events import (
    BlocksAllocated, BlocksEvicted, BlocksFreed, BlocksStored, EngineIdle, PrefixCacheHit, RequestFinished,
    RequestPreempted, RequestQueued, RequestResumed, RequestScheduled, RequestWaiting, StepRecord, StepStarted,
)
from tracevllm.entrypoints.ui.recorded_events import trace_events
from viz.trace_loader import load_trace

REQUEST_EVENTS = (RequestQueued, RequestWaiting, RequestScheduled, RequestPreempted, RequestFinished)


@pytest.fixture(scope="module")
def trace(recording):
    return load_trace(recording.trace_dir)


@pytest.fixture(scope="module")
def events(trace):
    return [timed.event for timed in trace_events(trace)]


def test_steps_come_in_order_without_gaps(trace, events):
    steps = [(type(e), e.step) for e in events if isinstance(e, (StepStarted, StepRecord))]
    numbers = list(range(1, len(trace.steps) + 1))
    assert steps == [(kind, n) for n in numbers for kind in (StepStarted, StepRecord)]
    records = [e for e in events if isinstance(e, StepRecord)]
    for record, step in zip(records, trace.steps):
        assert [s.request_id for s in record.batch.scheduled] == list(step.req_ids)
        assert record.gauges.num_free_blocks == step.num_free_blocks
        assert set(record.durations) == {"schedule", "execute_model", "sample", "update_from_output"}
    # The engine had nothing left to do after the last step of each generate() call (two of them).
    assert sum(isinstance(e, EngineIdle) for e in events) == 2 and isinstance(events[-1], EngineIdle)


def test_each_request_lives_in_order(recording, trace, events):
    lives = defaultdict(list)
    for e in events:
        if isinstance(e, REQUEST_EVENTS):
            lives[e.request_id].append(e)
    assert list(lives) == list(trace.requests)  # queued in arrival order
    for request_id, life in lives.items():
        assert isinstance(life[0], RequestQueued) and isinstance(life[-1], RequestFinished)
        assert isinstance(life[1], (RequestWaiting, RequestScheduled))
        preempted = [e for e in life if isinstance(e, RequestPreempted)]
        assert len(preempted) == sum(isinstance(e, RequestResumed) for e in life) == recording.preemptions[request_id]
        # each preemption is followed, sooner or later, by a resumption before the finish
        kinds = [type(e) for e in life if isinstance(e, (RequestScheduled, RequestPreempted))]
        assert all(a is not b for a, b in zip(kinds, kinds[1:])) and kinds[-1] is not RequestPreempted
        assert life[0].trace_headers["traceparent"].split("-")[1] == trace.requests[request_id].trace_id
        assert life[-1].num_output_tokens == trace.requests[request_id].num_output_tokens


def test_block_events_replay_to_the_engines_block_tables(recording, events):
    held: dict[str, list[int]] = defaultdict(list)
    cached: set[int] = set()
    tables = []
    for e in events:
        if isinstance(e, (BlocksAllocated, PrefixCacheHit)):
            held[e.request_id] += e.block_ids
        elif isinstance(e, BlocksFreed):
            for block_id in e.block_ids:
                held[e.request_id].remove(block_id)  # ValueError: a block freed that it did not hold
        elif isinstance(e, BlocksStored):
            cached.update(e.block_ids)
        elif isinstance(e, BlocksEvicted):
            cached.difference_update(e.block_ids)
        elif isinstance(e, StepRecord):
            tables.append({r: tuple(blocks) for r, blocks in held.items() if blocks})
    assert tables == recording.block_tables
    # At the end no request holds a block; the prefix cache still finds the shared prompt's blocks.
    assert not any(held.values()) and cached
    hits = [e for e in events if isinstance(e, PrefixCacheHit)]
    assert hits and all(set(e.block_ids) <= set(range(1, 17)) for e in hits)  # block 0 is the null block
