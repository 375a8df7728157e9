"""The engine core's side of the live event stream (engine/event_publisher.py), on real ZMQ sockets:
a session starts with a snapshot of the engine that says where its steps start, a step's events go as
one message when the step closes and an event between steps at once, a client that joins the session
gets a snapshot of its own, nothing waits when nobody reads (the lost messages are counted and told),
and ``PublishEvents`` attaches the publisher to the recorder and detaches it, so that with nobody
listening the engine records nothing."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import zmq

from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import EngineIdle, RequestQueued, RequestWaiting, StepRecord, StepStarted
from tests.core.test_scheduler import make_request, make_scheduler, run_step
from tracevllm.engine import EngineCoreRequestType, PublishEvents
from tracevllm.engine import event_publisher
from tracevllm.engine.core_proc import EngineCoreProc
from tracevllm.engine.event_publisher import EngineEventPublisher, EventsHeader, decode_events
from tracevllm.engine.snapshot import EngineSnapshot
from tracevllm.engine.utils import get_open_zmq_ipc_path, remove_ipc_files

EMPTY = EngineSnapshot([], [])


@pytest.fixture
def sockets():
    """A bound PULL socket as the API server has it, its address, and a context for the engine's side."""
    ctx = zmq.Context()
    address = get_open_zmq_ipc_path("events")
    pull = ctx.socket(zmq.PULL)
    pull.bind(address)
    yield ctx, pull, address
    pull.close(linger=0)
    remove_ipc_files(address)
    ctx.destroy(linger=0)


def receive(pull: zmq.Socket) -> tuple[EventsHeader, list]:
    assert pull.poll(5000), "no message within 5 s"
    return decode_events(pull.recv_multipart())


def test_a_session_step_by_step(sockets):
    ctx, pull, address = sockets
    publisher, events = EngineEventPublisher(ctx), EventRecorder()
    events.num_steps = 41
    publisher.control(PublishEvents(address, 3), events, make_scheduler())
    assert receive(pull) == (EventsHeader(3, 41, 0, snapshot=True), EMPTY)

    queued = RequestQueued("a", 1.0, 5, 0)
    publisher.on_event(queued)  # between steps: at once
    assert receive(pull) == (EventsHeader(3, 41, 0), [queued])
    step = [StepStarted(42, 2.0), RequestQueued("b", 2.1, 3, 0), StepRecord(42, 2.0, {"schedule": 0.1}, None, None)]
    for event in step[:2]:
        publisher.on_event(event)
    assert not pull.poll(100)  # the step is open: its events wait for its record
    publisher.on_event(step[2])
    assert receive(pull) == (EventsHeader(3, 42, 0), step)
    publisher.on_event(EngineIdle(3.0))
    assert receive(pull) == (EventsHeader(3, 42, 0), [EngineIdle(3.0)])


def test_nothing_waits_for_a_reader_that_is_not_there(monkeypatch):
    """Connected to an address nobody reads yet, the publisher queues EVENTS_HWM messages, drops the
    rest without blocking, and the first message that goes after them says how many it dropped."""
    monkeypatch.setattr(event_publisher, "EVENTS_HWM", 4)
    ctx = zmq.Context()
    address = get_open_zmq_ipc_path("events")
    publisher = EngineEventPublisher(ctx)
    publisher.control(PublishEvents(address, 1), EventRecorder(), make_scheduler())
    started = time.perf_counter()
    for i in range(10):
        publisher.on_event(EngineIdle(float(i)))
    lost = publisher.num_lost
    assert time.perf_counter() - started < 1.0 and 0 < lost <= 11 - 4
    pull = ctx.socket(zmq.PULL)
    pull.bind(address)
    try:
        assert [receive(pull)[0].num_lost for _ in range(11 - lost)] == [0] * (11 - lost)
        time.sleep(0.2)  # ZMQ tells the sending socket a moment later that the queue has room again
        publisher.on_event(EngineIdle(10.0))
        header, events = receive(pull)
        assert header.num_lost == lost and events == [EngineIdle(10.0)] and publisher.num_lost == 0
    finally:
        pull.close(linger=0)
        remove_ipc_files(address)
        ctx.destroy(linger=0)


def test_publish_events_attaches_the_publisher_between_steps_and_detaches_it(sockets):
    """``EngineCoreProc._handle_client_request`` on a stand-in for the engine core: a new session
    attaches the publisher (nobody listened before, so the waiting reasons are forgotten and its
    listener hears them all at the next step) and sends a snapshot of the scheduler; the same session again (a client joined)
    sends another, with the reasons recorded since; ``PublishEvents(None)`` detaches it and recording
    is off again."""
    ctx, pull, address = sockets
    scheduler = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=1)
    core = SimpleNamespace(recorder=EventRecorder(), event_publisher=EngineEventPublisher(ctx), stats_stale=False,
                           scheduler=scheduler)
    scheduler.recorder = scheduler.kv_cache_manager.recorder = scheduler.kv_cache_manager.block_pool.recorder = core.recorder
    running, waiting = make_request(6, max_tokens=20, ignore_eos=True), make_request(6)
    for request in (running, waiting):
        scheduler.add_request(request)
    with core.recorder.step():
        run_step(scheduler)  # step 1, unobserved: one runs (2 blocks), one waits for max_num_seqs
    scheduler.waiting_reasons.recorded["gone"] = RequestWaiting("gone", 0.5, "kv_cache")  # an earlier listener's
    EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS, PublishEvents(address, 1))
    assert core.recorder.enabled and scheduler.waiting_reasons.recorded == {}
    assert scheduler.waiting_reasons.reordered  # the whole queue is walked at the next step
    header, snapshot = receive(pull)
    assert header == EventsHeader(1, 1, 0, snapshot=True)
    assert [(r.request_id, r.status, r.block_ids, r.waiting) for r in snapshot.requests] == [
        (waiting.request_id, "waiting", [], None), (running.request_id, "running", [1, 2], None)]  # block 0: the null block
    with core.recorder.step():
        run_step(scheduler)
    header, events = receive(pull)
    assert header.num_steps == 2 and isinstance(events[0], StepStarted) and isinstance(events[-1], StepRecord)
    EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS, PublishEvents(address, 1))
    header, snapshot = receive(pull)  # a client joined: the waiting request says why, as heard at step 2
    assert header == EventsHeader(1, 2, 0, snapshot=True) and core.recorder.observers == [core.event_publisher]
    assert snapshot.requests[0].waiting.reason == "max_num_seqs"

    EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS, PublishEvents(None))
    assert not core.recorder.enabled and core.recorder.observers == []
    with core.recorder.step():
        run_step(scheduler)
    assert not pull.poll(100)
    EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS, PublishEvents(address, 2))
    header, _ = receive(pull)
    assert header == EventsHeader(2, 3, 0, snapshot=True) and core.recorder.observers == [core.event_publisher]


class Heard(list):
    """An observer that keeps what it hears, as a tracer would write it."""

    def on_event(self, event) -> None:
        self.append(event)


def test_a_session_beside_a_tracer_leaves_the_tracer_s_events_as_they_were(sockets):
    """With a tracer listening, the waiting reasons are current: a page that opens a session gets them
    in its snapshot, and the engine does not record them again (each would be in the trace twice)."""
    ctx, pull, address = sockets
    scheduler = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=1)
    core = SimpleNamespace(recorder=EventRecorder(), event_publisher=EngineEventPublisher(ctx), stats_stale=False,
                           scheduler=scheduler)
    scheduler.recorder = scheduler.kv_cache_manager.recorder = scheduler.kv_cache_manager.block_pool.recorder = core.recorder
    tracer = Heard()
    core.recorder.add_observer(tracer)
    running, waiting = make_request(6, max_tokens=20, ignore_eos=True), make_request(6)
    for request in (running, waiting):
        scheduler.add_request(request)
    for session in (1, 2, 3):  # three pages open, one after the other, between steps
        with core.recorder.step():
            run_step(scheduler)
        EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS,
                                              PublishEvents(address, session))
        header, snapshot = receive(pull)
        while not header.snapshot:  # the last step's events, sent to the session before
            header, snapshot = receive(pull)
        assert snapshot.requests[0].waiting.reason == "max_num_seqs"  # heard by the tracer at step 1
    with core.recorder.step():
        run_step(scheduler)
    reasons = [(e.request_id, e.reason) for e in tracer if isinstance(e, RequestWaiting)]
    assert reasons == [(waiting.request_id, "max_num_seqs")]  # once, as without the pages
