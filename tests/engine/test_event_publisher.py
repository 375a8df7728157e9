"""The engine core's side of the live event stream (engine/event_publisher.py), on real ZMQ sockets:
a session starts with a message that says where its steps start, a step's events go as one message
when the step closes and an event between steps at once, nothing waits when nobody reads (the lost
messages are counted and told), and ``PublishEvents`` attaches the publisher to the recorder and
detaches it, so that with nobody listening the engine records nothing."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import zmq

from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import EngineIdle, RequestQueued, StepRecord, StepStarted
from tracevllm.core.sched.request_queue import FCFSRequestQueue
from tracevllm.core.sched.waiting_reasons import WaitingReasons
from tracevllm.engine import EngineCoreRequestType, PublishEvents
from tracevllm.engine import event_publisher
from tracevllm.engine.core import EngineCoreProc
from tracevllm.engine.event_publisher import EngineEventPublisher, EventsHeader, decode_events
from tracevllm.engine.utils import get_open_zmq_ipc_path, remove_ipc_files


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
    publisher = EngineEventPublisher(ctx)
    publisher.start(address, session=3, num_steps=41)
    assert receive(pull) == (EventsHeader(3, 41, 0), [])

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
    publisher.start(address, session=1, num_steps=0)
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
    attaches the publisher (the waiting reasons are forgotten, so that its listener hears them all at
    the next step), ``PublishEvents(None)`` detaches it and recording is off again."""
    ctx, pull, address = sockets
    core = SimpleNamespace(events=EventRecorder(), event_publisher=EngineEventPublisher(ctx), stats_stale=False,
                           scheduler=SimpleNamespace(waiting_reasons=WaitingReasons(FCFSRequestQueue())))
    core.scheduler.waiting_reasons.recorded["r"] = ("kv_cache", "")
    with core.events.step():
        pass  # step 1, unobserved
    EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS, PublishEvents(address, 1))
    assert core.events.enabled and core.scheduler.waiting_reasons.recorded == {}
    assert core.scheduler.waiting_reasons.reordered  # the whole queue is walked at the next step
    assert receive(pull) == (EventsHeader(1, 1, 0), [])
    with core.events.step():
        pass
    header, events = receive(pull)
    assert header.num_steps == 2 and [type(e) for e in events] == [StepStarted, StepRecord]

    EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS, PublishEvents(None))
    assert not core.events.enabled and core.events.observers == []
    with core.events.step():
        pass
    assert not pull.poll(100)
    EngineCoreProc._handle_client_request(core, EngineCoreRequestType.PUBLISH_EVENTS, PublishEvents(address, 2))
    assert receive(pull) == (EventsHeader(2, 3, 0), []) and core.events.observers == [core.event_publisher]
