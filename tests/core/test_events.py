"""The engine core's event stream (core/events.py): a run forced to chunk, preempt and hit the prefix
cache, checked event by event against the scheduler's and KV cache manager's own state."""

from __future__ import annotations

import msgspec

from tests.core.test_scheduler import make_request, make_scheduler, run_step
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import (
    BatchScheduled, BlocksAllocated, BlocksEvicted, BlocksFreed, BlocksStored, EngineEvent, PrefixCacheHit,
    RequestFinished, RequestPreempted, RequestQueued, RequestResumed, RequestScheduled, RequestWorkload, StepGauges,
    StepRecord, StepStarted,
)
from tracevllm.core.kv_cache_utils import hash_request_tokens

REQUEST_EVENTS = (RequestQueued, RequestScheduled, RequestResumed, RequestPreempted, RequestFinished)


class Recorded(list):
    def on_event(self, event: EngineEvent) -> None:
        self.append(event)


def run(scheduler, recorded: Recorded, max_steps: int = 200) -> list[dict[str, list[int]]]:
    """Step until done (each inside ``events.step()``, as EngineCore.step runs); the block tables the
    KV cache manager holds after each step."""
    truth = []
    while scheduler.has_unfinished_requests() and len(truth) < max_steps:
        with scheduler.recorder.step() as step:
            run_step(scheduler)
            step.lap("schedule")
        tables = scheduler.kv_cache_manager.req_to_blocks
        truth.append({r: [b.block_id for b in blocks] for r, blocks in tables.items() if blocks})
    return truth


def test_a_run_that_chunks_preempts_and_hits_the_prefix_cache():
    # 12 blocks of 4 tokens (13 with the null block), a budget of 16 tokens per step. A's 20-token prompt takes two steps
    # (chunked); B shares A's first 12 tokens (3 blocks: a prefix hit once A computed them); C and D
    # grow until blocks run out, so the newest running request is preempted and later resumed.
    s = make_scheduler(num_blocks=13, block_size=4, budget=16, max_num_seqs=4)
    recorded = Recorded()
    s.recorder.add_observer(recorded)
    shared = list(range(100, 112))
    a = make_request(prompt=shared + list(range(200, 208)), max_tokens=10, ignore_eos=True)
    b = make_request(prompt=shared + list(range(300, 306)), max_tokens=10, ignore_eos=True)
    c = make_request(prompt=list(range(400, 410)), max_tokens=10, ignore_eos=True)
    for r in (a, b, c):
        s.add_request(r)
    truth = run(s, recorded)
    assert not s.has_unfinished_requests()
    ids = [a.request_id, b.request_id, c.request_id]

    # Each request's own events, in order: queued, admitted, (preempted, resumed)*, finished.
    for req_id in ids:
        life = [type(e) for e in recorded if isinstance(e, REQUEST_EVENTS) and e.request_id == req_id]
        assert life[:2] == [RequestQueued, RequestScheduled] and life[-1] is RequestFinished
        middle = life[2:-1]
        assert middle == [RequestPreempted, RequestResumed] * (len(middle) // 2)
    assert any(isinstance(e, RequestPreempted) for e in recorded)

    # Replaying the block events gives the manager's block tables after every step, and every step
    # record adds up: blocks in use + free blocks + the null block = all blocks.
    held: dict[str, list[int]] = {}
    last_freed: dict[str, list[int]] = {}
    step_index = 0
    stored: set[int] = set()
    for event in recorded:
        if isinstance(event, (BlocksAllocated, PrefixCacheHit)):
            held.setdefault(event.request_id, []).extend(event.block_ids)
        elif isinstance(event, BlocksFreed):
            last_freed[event.request_id] = held.pop(event.request_id)
            assert event.block_ids == last_freed[event.request_id][::-1]  # last block first: evicted first
        elif isinstance(event, BlocksStored):
            stored.update(event.block_ids)
        elif isinstance(event, BlocksEvicted):
            assert set(event.block_ids) <= stored  # only cached blocks are evicted
            stored -= set(event.block_ids)
        elif isinstance(event, (RequestPreempted, RequestFinished)):
            assert event.block_ids == last_freed.pop(event.request_id, [])  # what it held, in table order
        elif isinstance(event, StepRecord):
            assert held == truth[step_index], event.step
            in_use = len({b for table in held.values() for b in table})
            assert in_use + event.gauges.num_free_blocks + 1 == event.gauges.num_gpu_blocks == 13
            step_index += 1
    assert step_index == len(truth) and held == {}

    # Step records: numbered from 1, each with its batch and gauges; one StepStarted before each.
    records = [e for e in recorded if isinstance(e, StepRecord)]
    assert [r.step for r in records] == list(range(1, len(records) + 1))
    assert [e.step for e in recorded if isinstance(e, StepStarted)] == [r.step for r in records]
    assert all(r.batch is not None and r.gauges is not None and set(r.durations) == {"schedule"} for r in records)
    assert not any(isinstance(e, (BatchScheduled, StepGauges)) for e in recorded)  # folded into the records
    for r in records:
        assert sum(x.num_tokens for x in r.batch.scheduled) == r.batch.num_scheduled_tokens <= 16

    # A is chunked: 16 prompt tokens in step 1, the last 4 in step 2, both prefills; then decodes.
    a_steps = [(r.step, x) for r in records for x in r.batch.scheduled if x.request_id == a.request_id]
    assert [(n, x.num_tokens, x.is_decode) for n, x in a_steps[:3]] == [(1, 16, False), (2, 4, False), (3, 1, True)]

    # B's first 3 blocks are A's: a prefix hit on the blocks A computed (and stored) first.
    (hit,) = [e for e in recorded if isinstance(e, PrefixCacheHit)]
    a_blocks = next(e for e in recorded if isinstance(e, RequestScheduled) and e.request_id == a.request_id).block_ids
    assert hit.request_id == b.request_id and hit.block_ids == a_blocks[:3] and hit.num_cached_tokens == 12
    admitted_b = next(e for e in recorded if isinstance(e, RequestScheduled) and e.request_id == b.request_id)
    assert admitted_b.num_computed_tokens == 12 and admitted_b.cached_block_ids == a_blocks[:3]

    finished = {e.request_id: e for e in recorded if isinstance(e, RequestFinished)}
    assert {e.finish_reason for e in finished.values()} == {"length"}
    assert sum(e.num_preemptions for e in finished.values()) == sum(
        isinstance(e, RequestPreempted) for e in recorded)


def test_a_request_records_its_workload_and_each_batch_its_computed_tokens():
    """``RequestWorkload``: the prompt's block hashes as the prefix cache makes them (made for it with
    caching off too) and the sampling parameters the scheduler reads; each ``ScheduledRequest``: the
    tokens the request had computed before the step (what its attention reads besides its new ones)."""
    for caching in (True, False):
        s = make_scheduler(block_size=4, budget=8, max_num_seqs=4, caching=caching)
        recorded = Recorded()
        s.recorder.add_observer(recorded)
        r = make_request(prompt=list(range(100, 110)), max_tokens=3, min_tokens=2, ignore_eos=True)
        s.add_request(r)
        assert [e for e in recorded if isinstance(e, RequestWorkload)] == [
            RequestWorkload(r.request_id, 4, hash_request_tokens(4, r.prompt_token_ids), 3, 2, True, False)]
        run(s, recorded)
        batches = [x for e in recorded if isinstance(e, StepRecord) for x in e.batch.scheduled]
        # 10 prompt tokens at 8 a step: two chunks, then two decodes up to max_tokens=3.
        assert [(x.num_tokens, x.num_computed_tokens, x.is_decode) for x in batches] == [
            (8, 0, False), (2, 8, False), (1, 10, True), (1, 11, True)]


def test_record_passes_every_event_on_and_hold_for_step_keeps_a_part_for_the_record():
    recorder, recorded = EventRecorder(), Recorded()
    recorder.add_observer(recorded)
    gauges = StepGauges(10, 12, 1 / 6, 1, 0)
    recorder.hold_for_step(gauges)  # no step open: no record to keep it for
    with recorder.step():
        recorder.hold_for_step(gauges)
    started, record = recorded
    assert isinstance(started, StepStarted) and isinstance(record, StepRecord)
    assert record.gauges is gauges and record.batch is None


def test_a_step_context_provider_gives_each_step_what_it_carries_to_the_workers():
    """An observer with ``step_context()`` is asked once the step's StepStarted is recorded; the step
    carries the answer (``step.context``, which EngineCore puts in SchedulerOutput.step_context)."""
    class Provider(Recorded):
        def step_context(self) -> dict[str, str]:
            return {"step": str(self[-1].step)}  # from the StepStarted it has just heard

    recorder = EventRecorder([Recorded()])
    with recorder.step() as step:
        assert step.context is None  # a plain observer only listens
    provider = Provider()
    recorder.add_observer(provider)
    with recorder.step() as step:
        assert step.context == {"step": "2"}
    assert recorder.context_providers == [provider]


def test_the_events_cross_a_process_boundary():
    """Request events travel to the front end in EngineCoreOutput.events: they survive msgpack."""
    s = make_scheduler()
    r = make_request(5, max_tokens=1)
    s.add_request(r)
    _, outputs = run_step(s)
    (output,) = outputs.outputs
    encoded = msgspec.msgpack.encode(output.events)
    decoded = msgspec.msgpack.decode(encoded, type=list[RequestQueued | RequestScheduled | RequestResumed
                                                       | RequestPreempted | RequestFinished])
    assert [type(e) for e in decoded] == [RequestQueued, RequestScheduled, RequestFinished]
    assert decoded == output.events


def test_nobody_listening_builds_nothing(monkeypatch):
    """Without an observer the step's timer is a shared no-op and no KV, batch or step event is even
    built (each recording site is one flag check); only the request events the front end needs remain."""
    def refuse(*args, **kwargs):
        raise AssertionError("an event was built with nobody listening")

    for module, names in [("tracevllm.core.kv_cache_manager", ("BlocksAllocated", "BlocksFreed", "PrefixCacheHit")),
                          ("tracevllm.core.block_pool", ("BlocksStored", "BlocksEvicted")),
                          ("tracevllm.core.sched.scheduler", ("BatchScheduled", "StepGauges", "RequestWorkload")),
                          ("tracevllm.core.events", ("StepRecord", "StepStarted"))]:
        for name in names:
            monkeypatch.setattr(f"{module}.{name}", refuse)
    s = make_scheduler(num_blocks=8, block_size=4)
    assert not s.recorder.enabled
    requests = [make_request(prompt=list(range(100, 110)), max_tokens=6) for _ in range(2)]
    for r in requests:
        s.add_request(r)
    run(s, Recorded())
    assert all(r.is_finished() for r in requests)


def test_a_removed_observer_hears_nothing_more_and_the_last_one_turns_recording_off():
    """The server's event stream comes and goes (engine/event_publisher.py): with no observer left the
    recorder is back to one flag check, and a step records nothing."""
    class Listener(Recorded):  # a StepContextProvider too, to see it leave that list
        def step_context(self) -> dict[str, str]:
            return {}

    tracer, listener = Recorded(), Listener()
    recorder = EventRecorder([tracer])
    recorder.add_observer(listener)
    recorder.remove_observer(listener)
    assert recorder.enabled and recorder.context_providers == []
    with recorder.step():
        pass
    assert listener == [] and [type(e) for e in tracer] == [StepStarted, StepRecord]
    recorder.remove_observer(tracer)
    with recorder.step() as step:
        assert not step.timing
    assert not recorder.enabled and len(tracer) == 2 and recorder.num_steps == 2
