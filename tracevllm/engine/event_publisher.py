"""EngineEventPublisher: the engine core's events, sent to the API server while someone listens.

``GET /v1/engine/events`` (``entrypoints/openai/engine_events.py``) streams what the engine core
records (``core/events.py``). With nobody observing, the engine core records nothing
(``EventRecorder.enabled`` is one flag check), so the publisher is an observer attached only while the
API server has stream clients, and only between two steps, so that it hears whole steps::

    API server (AsyncMPClient)                                EngineCore process, busy loop
    first stream client ── PublishEvents(address, session) ──▶ between steps: add_observer(publisher)
    events_socket  PULL  ipc://…-events  ◀── PUSH ── EngineSnapshot, then publisher.on_event: a message a step
    another client joins ─ PublishEvents(address, session) ──▶ between steps: an EngineSnapshot
    last client gone ───── PublishEvents(None) ──────────────▶ remove_observer: one flag check again

A message is ``[EventsHeader, event, event, ...]``, one msgpack frame each. The events of a step
(``StepStarted`` to its ``StepRecord``) go as one message when the step closes; an event recorded
between steps (a new request's ``RequestQueued``, an abort's ``RequestFinished``, ``EngineIdle``) goes
at once. A session's first message, and the answer to each later ``PublishEvents`` of the same
session (a client joined), is ``[EventsHeader(snapshot=True), EngineSnapshot]``
(``engine/snapshot.py``): the requests and blocks as they are after step ``num_steps``, which the
clients that join there start from.
Each event is encoded as it is recorded (a few microseconds on the busy loop's thread), since the
lists inside an event may still change later in the step; the bytes cannot.

Why a socket of its own rather than the outputs (``EngineCoreOutputs``): the outputs are every
request's tokens, read by the one output-handler task that detokenizes all the streams, and travel
only when a step has outputs; events in them would slow that task and could not be dropped without
dropping tokens. This channel is bounded and the engine never waits on it: a message is sent without
blocking, and when ``EVENTS_HWM`` messages are already queued (the API server has stopped reading)
it is dropped and counted. The next message that goes says how many were lost, and the API server
then ends every stream with ``Dropped`` rather than let a client see a gap.

vLLM publishes its KV cache events much the same way (``ZmqEventPublisher``,
``vllm/distributed/kv_events.py``: batches of msgspec structs on a ZMQ PUB socket for outside
subscribers, with sequence numbers and a socket to replay what one missed). Here the one subscriber is
the API server, which tells the engine core when to publish, and a missed message ends the streams.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import zmq

from tracevllm.core.events import EngineEvent, StepRecord, StepStarted
from tracevllm.engine.snapshot import EngineSnapshot, take_snapshot

if TYPE_CHECKING:
    from tracevllm.core.event_recorder import EventRecorder
    from tracevllm.core.sched.scheduler import Scheduler
    from tracevllm.engine import PublishEvents

EVENTS_HWM = 10_000  # messages queued on each side of the events socket before the engine core drops them


class EventsHeader(msgspec.Struct, array_like=True):
    """The first frame of every message on the events socket."""

    session: int  # the PublishEvents that started this publishing
    num_steps: int  # steps begun so far: the number of the step these events are in, or of the last one
    num_lost: int = 0  # messages of this session dropped just before this one (the queues were full)
    snapshot: bool = False  # the one frame after this header is an EngineSnapshot, not events


class EngineEventPublisher:
    """An ``EngineObserver`` that sends what it hears to the API server (the module docstring draws
    it). The busy loop starts and attaches it, or detaches it, between steps: a session hears every
    step after the ``num_steps`` of its first message, whole and in order."""

    def __init__(self, ctx: zmq.Context, snapshot: Callable[[Scheduler], EngineSnapshot] = take_snapshot) -> None:
        """``snapshot``: how the scheduler is told to a client that joins (a vLLM one's:
        ``tracevllm/vllm/snapshot.py``)."""
        self.ctx = ctx
        self.snapshot = snapshot
        self.socket: zmq.Socket | None = None  # connected at the first start
        self.encoder = msgspec.msgpack.Encoder()
        self.session = 0
        self.num_steps = 0
        self.num_lost = 0
        self.in_step = False
        self.pending: list[bytes] = []

    def control(self, request: PublishEvents, recorder: EventRecorder, scheduler: Scheduler) -> None:
        """Between steps: open a session (``request.session`` is new), send a snapshot for a client
        that joins the open one (the same session), or stop (no address)."""
        attached = self in recorder.observers
        if request.address is None or request.session != self.session or not attached:
            if attached:
                recorder.remove_observer(self)
            if request.address is None:
                return
            if not recorder.enabled:
                # Nobody listened (no tracer): the reasons were not kept up to date, so every waiting
                # request records its own again at the next step. With a listener they are current,
                # and the snapshot carries them: recording them again would write each one twice into
                # that listener's trace.
                scheduler.waiting_reasons.forget_all()
            self._start(request.address, request.session, recorder.num_steps)
            recorder.add_observer(self)
        self.pending = [self.encoder.encode(self.snapshot(scheduler))]
        self._send(snapshot=True)

    def _start(self, address: str, session: int, num_steps: int) -> None:
        """Open ``session``, connecting to the client's events socket (once): its first step will be
        ``num_steps + 1``."""
        if self.socket is None:
            self.socket = self.ctx.socket(zmq.PUSH)
            self.socket.setsockopt(zmq.SNDHWM, EVENTS_HWM)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.connect(address)
        self.session, self.num_steps, self.num_lost = session, num_steps, 0
        self.in_step, self.pending = False, []

    def on_event(self, event: EngineEvent) -> None:
        self.pending.append(self.encoder.encode(event))
        if isinstance(event, StepStarted):
            self.in_step, self.num_steps = True, event.step
        elif isinstance(event, StepRecord) or not self.in_step:
            self.in_step = False
            self._send()

    def _send(self, snapshot: bool = False) -> None:
        assert self.socket is not None
        header = self.encoder.encode(EventsHeader(self.session, self.num_steps, self.num_lost, snapshot))
        try:
            self.socket.send_multipart([header, *self.pending], zmq.NOBLOCK)
            self.num_lost = 0
        except zmq.Again:  # the API server is not reading: never wait for it
            self.num_lost += 1
        self.pending = []


_header_decoder = msgspec.msgpack.Decoder(EventsHeader)
_event_decoder = msgspec.msgpack.Decoder(EngineEvent)
_snapshot_decoder = msgspec.msgpack.Decoder(EngineSnapshot)


def decode_events(frames: list[bytes]) -> tuple[EventsHeader, list[EngineEvent] | EngineSnapshot]:
    """One message of the events socket, as the API server reads it: its events, or its snapshot."""
    header = _header_decoder.decode(frames[0])
    if header.snapshot:
        return header, _snapshot_decoder.decode(frames[1])
    return header, [_event_decoder.decode(frame) for frame in frames[1:]]
