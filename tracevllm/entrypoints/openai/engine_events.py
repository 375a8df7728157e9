"""``GET /v1/engine/events``: the engine core's events, live, as Server-Sent Events.

Every message is one line ``data: <json>`` and a blank line. The JSON object is one engine event
(``core/events.py``): ``"type"`` is its class name (``StepRecord``, ``RequestQueued``, ...), the other
keys are its fields by name, nested structs as objects and bytes (block hashes) as hex. Two messages
are the stream's own: the first is always ``Hello`` (what the engine is, the last step recorded so
far, and the engine's requests and KV blocks as they are after it, ``engine/snapshot.py``: the first
``StepRecord`` that follows is the next step's, step numbers then have no gaps, and the events that
follow, applied to the snapshot, account for every block); a stream that ends early ends with
``Dropped``. Query parameters: ``types=StepRecord,RequestFinished`` keeps those event classes (``types``
may be repeated: the names add up); ``request_id=cmpl-...`` keeps one request's events (the id of the
response, which also covers its prompts' and samples' ids in the engine, ``cmpl-...-0``,
``1_cmpl-...-0``), and the ``StepRecord``s of the steps whose batch holds it::

    EngineCore ── EngineEventPublisher ──ZMQ──▶ AsyncMPClient.get_events_async      (engine/event_publisher.py)
                                                      │  one reader task
                                                      ▼
                                 EngineEventFanOut.dispatch: each event to JSON once, then to every
                                 client that wants it, into that client's pending bytes
                                                      │
                      EventStreamResponse (one per client) ◀── take(): all its pending bytes, one write

The engine core publishes only while a client is connected: the first client starts a session,
the last one to leave stops it, and the engine is back to one flag check. The session's first
message is a snapshot of the engine; a client that joins later waits (a step at most) for the
snapshot its arrival asks for, so that each client starts from a snapshot and hears every event
after it.

**A client that falls behind** never slows the engine nor the other clients: the fan-out only appends
to each client's pending bytes, and a writer task per client empties them into its connection. A
client whose connection takes no more (it stopped reading, and the kernel's buffers and uvicorn's
are full) has its messages pile up: once the oldest has waited ``MAX_LAG_S``, or more than
``MAX_PENDING_BYTES`` wait, the client is dropped: the fan-out forgets it and its pending messages
are replaced by ``Dropped``, the last message it will read if it reads again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, get_args

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Send

from tracevllm.core.events import EngineEvent, StepRecord
from tracevllm.engine.exceptions import EngineDeadError
from tracevllm.engine.snapshot import EngineSnapshot

# Annotations only: the messages (Hello, sse_message, EventFilter) serve `tracevllm traces view` too,
# which replays a trace and loads no engine.
if TYPE_CHECKING:
    from tracevllm.engine.event_publisher import EventsHeader

logger = logging.getLogger("tracevllm")

MAX_LAG_S = 2.0  # a client whose oldest pending message has waited this long has fallen behind
MAX_PENDING_BYTES = 16 * 1024 * 1024  # as has one with this much pending
EVENT_TYPES = frozenset(cls.__name__ for cls in get_args(EngineEvent))
MAX_ECHOED_CHARS = 200  # of a client's unknown type names, quoted back in the 400


class EngineEventSource(Protocol):
    """What the fan-out needs of an engine core: ``AsyncMPClient`` (``tracevllm serve``'s API server),
    or the live page's side server on a running vLLM (``tracevllm/vllm/live_server.py``)."""

    async def publish_events_async(self, session: int | None) -> None:
        """Ask the engine core to publish as ``session`` (its number again: a snapshot), or (None) to stop."""

    async def get_events_async(self) -> tuple[EventsHeader, list[EngineEvent] | EngineSnapshot]:
        """The next message (events, or a snapshot); EngineDeadError once the engine core is gone."""


class Hello(msgspec.Struct, tag=True):
    """The first message of every stream. ``step``: the last step recorded so far (-1: none yet);
    ``snapshot``: the requests and blocks after it (None: a recorded run's replay, which starts from
    an empty engine); ``source``: "live" here (``traces view`` says "trace"); ``num_null_blocks``: the
    blocks of the ``num_gpu_blocks`` that are never held nor free, block 0, vLLM's null block (none in
    a trace recorded before it, of format 3 or older)."""

    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    model: str
    jaeger_url: str | None
    step: int
    snapshot: EngineSnapshot | None = None
    source: str = "live"
    num_null_blocks: int = 1


class Dropped(msgspec.Struct, tag=True):
    """The last message of a stream that ends early: the client fell behind, or the engine did."""

    reason: str


def to_json_object(value):
    """An engine event (an ``array_like`` struct, so not ``msgspec.to_builtins``' dict) as JSON's
    builtins: structs as dicts by field name, bytes as hex."""
    if isinstance(value, msgspec.Struct):
        return {name: to_json_object(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, list):
        return [to_json_object(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json_object(item) for key, item in value.items()}
    if isinstance(value, bytes):
        return value.hex()
    return value


def sse_message(value: msgspec.Struct) -> bytes:
    """One SSE message: an engine event with its class name as ``type``, or a ``Hello``/``Dropped``."""
    if isinstance(value, Dropped):
        payload = msgspec.json.encode(value)
    else:
        payload = msgspec.json.encode({"type": type(value).__name__, **to_json_object(value)})
    return b"data: " + payload + b"\n\n"


def request_ids_of(event: EngineEvent) -> list[str]:
    """The requests an event is about: its ``request_id``, or a step's batch (scheduled or preempted)."""
    if isinstance(event, StepRecord):
        batch = event.batch
        return [] if batch is None else [s.request_id for s in batch.scheduled] + batch.preempted_request_ids
    request_id = getattr(event, "request_id", "")
    return [request_id] if request_id else []


@dataclass
class EventFilter:
    """A client's query: the event classes it keeps (None: all) and the request it follows (None: all)."""

    types: frozenset[str] | None = None
    request_id: str | None = None

    @classmethod
    def from_query(cls, types: list[str] | None, request_id: str | None) -> "EventFilter":
        """From the query's ``types`` (each value comma-separated class names; a repeated ``types``
        adds its names, as a repeated key does in most HTTP APIs) and ``request_id``. ValueError for
        a ``types`` that names no class, or an unknown one (its names cut to ``MAX_ECHOED_CHARS``)."""
        if types is None:
            return cls(None, request_id or None)
        names = frozenset(name.strip() for value in types for name in value.split(",") if name.strip())
        known = ", ".join(sorted(EVENT_TYPES))
        if not names:
            raise ValueError(f"types: names no event type; give one or more of {known}")
        if unknown := sorted(names - EVENT_TYPES - {"Hello", "Dropped"}):
            listed = ", ".join(unknown)
            if len(listed) > MAX_ECHOED_CHARS:
                listed = f"{listed[:MAX_ECHOED_CHARS]}... ({len(unknown)} names)"
            raise ValueError(f"types: unknown event type(s) {listed}; the engine's events are {known}")
        return cls(names, request_id or None)

    def __post_init__(self) -> None:
        # The response's id names the request; in the engine its prompts are "<id>-<i>" (completions)
        # and its samples "<j>_<id>" (n > 1): all of them are the request's.
        self.request_pattern = None if self.request_id is None else re.compile(
            rf"(\d+_)?{re.escape(self.request_id)}(-\d+)?")

    def wants(self, event: EngineEvent) -> bool:
        if self.types is not None and type(event).__name__ not in self.types:
            return False
        return self.request_pattern is None or any(self.request_pattern.fullmatch(r) for r in request_ids_of(event))


class StreamClient:
    """One SSE client: its filter, and the bytes waiting to be written to its connection."""

    def __init__(self, event_filter: EventFilter) -> None:
        self.filter = event_filter
        self.pending: list[bytes] = []
        self.num_pending_bytes = 0
        self.pending_since = 0.0  # when the oldest pending message came (time.monotonic())
        self.wakeup = asyncio.Event()
        self.ended = False  # nothing more will be added: the stream ends once ``pending`` is written

    def put(self, data: bytes, now: float) -> None:
        if not self.pending:
            self.pending_since = now
        self.pending.append(data)
        self.num_pending_bytes += len(data)
        self.wakeup.set()

    def lag(self, now: float) -> str | None:
        """Why the client has fallen behind (None: it has not)."""
        if self.pending and now - self.pending_since > MAX_LAG_S:
            return f"a message waited more than {MAX_LAG_S:.0f} s to be written to its connection"
        if self.num_pending_bytes > MAX_PENDING_BYTES:
            return f"more than {MAX_PENDING_BYTES} bytes waited for its connection"
        return None

    def end(self, last: Dropped | None = None) -> None:
        """No more messages: the stream ends after what is pending, or (``last``) after only that."""
        if last is not None:
            self.pending, self.num_pending_bytes = [sse_message(last)], 0
        self.ended = True
        self.wakeup.set()

    async def take(self) -> bytes | None:
        """Everything pending, as one write, once there is something; None when the stream ends."""
        while not self.pending:
            if self.ended:
                return None
            self.wakeup.clear()
            await self.wakeup.wait()
        data = b"".join(self.pending)
        self.pending, self.num_pending_bytes = [], 0
        return data


class EngineEventFanOut:
    """The API server's side of the stream: starts and stops the engine core's publishing, reads its
    messages (one task) and hands each event to every client that wants it (the module docstring
    draws it). ``hello``: the first message for each client, but for its ``step``."""

    def __init__(self, engine_core: EngineEventSource, hello: Hello) -> None:
        self.engine_core = engine_core
        self.hello = hello
        self.clients: list[StreamClient] = []  # live: they get every message from here on
        self.joining: list[StreamClient] = []  # waiting for the next snapshot, their Hello's
        self.session: int | None = None  # the session asked of the engine core (None: not publishing)
        self.num_sessions = 0
        self.reader: asyncio.Task | None = None
        self.control = asyncio.Lock()  # PublishEvents go out in the order they were decided
        self.control_tasks: set[asyncio.Task] = set()
        self.shut_down = False

    # ---- clients come and go -------------------------------------------------------------------

    def subscribe(self, event_filter: EventFilter) -> StreamClient:
        """A new client: it waits for a snapshot, which a new session sends first and which, for a
        session already open, its arrival asks for (one for all the clients that join meanwhile)."""
        client = StreamClient(event_filter)
        if not self.joining:
            if self.session is None:
                self.num_sessions += 1
                self.session = self.num_sessions
            self._publish(self.session)
        self.joining.append(client)
        return client

    def unsubscribe(self, client: StreamClient) -> None:
        """The client's response is over (it ended, or the client left): forget it; the last one to
        go stops the engine core's publishing."""
        for clients in (self.clients, self.joining):
            if client in clients:
                clients.remove(client)
        if self.session is not None and not self.clients and not self.joining:
            self.session = None
            self._publish(None)

    def drop(self, client: StreamClient, reason: str) -> None:
        logger.warning("Engine events: a client fell behind and is dropped (%s).", reason)
        client.end(Dropped(reason))
        self.unsubscribe(client)

    def close(self, reason: str) -> None:
        """End every stream with ``Dropped(reason)``."""
        for client in [*self.clients, *self.joining]:
            client.end(Dropped(reason))
            self.unsubscribe(client)

    def shutdown(self) -> None:
        """The server exits: end every stream after what is pending, and stop reading."""
        self.shut_down = True
        for client in [*self.clients, *self.joining]:
            client.end()
        if self.reader is not None:
            self.reader.cancel()


    def _publish(self, session: int | None) -> None:
        if self.shut_down:
            return
        if self.reader is None:
            self.reader = asyncio.get_running_loop().create_task(self._read())
        task = asyncio.get_running_loop().create_task(self._send_publish(session))
        self.control_tasks.add(task)
        task.add_done_callback(self.control_tasks.discard)

    async def _send_publish(self, session: int | None) -> None:
        async with self.control:
            try:
                await self.engine_core.publish_events_async(session)
            except EngineDeadError:
                pass  # the reader ends the streams

    # ---- the engine core's messages ------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                self.dispatch(*await self.engine_core.get_events_async())
                await asyncio.sleep(0)  # a backlog of messages must not hold up the clients' writes
        except EngineDeadError:
            self.close("The engine core died.")
        except Exception:
            logger.exception("Engine events: reading the engine core's events failed.")
            self.close("The server failed to read the engine core's events; see its log.")

    def dispatch(self, header: EventsHeader, events: list[EngineEvent] | EngineSnapshot) -> None:
        if header.session != self.session:
            return  # a session stopped since
        if header.num_lost:
            self.close(f"The server fell behind the engine core: {header.num_lost} messages were lost.")
            return
        now = time.monotonic()
        if isinstance(events, EngineSnapshot):  # the clients that joined start here
            hello = sse_message(msgspec.structs.replace(self.hello, step=header.num_steps or -1, snapshot=events))
            for client in self.joining:
                client.put(hello, now)
            self.clients += self.joining
            self.joining = []
            return
        messages: list[bytes | None] = [None] * len(events)  # made once, when a client wants it
        for client in list(self.clients):
            if reason := client.lag(now):
                self.drop(client, f"{reason} (step {header.num_steps})")
                continue
            wanted = []
            for i, event in enumerate(events):
                if client.filter.wants(event):
                    message = messages[i]
                    if message is None:
                        message = messages[i] = sse_message(event)
                    wanted.append(message)
            if wanted:
                client.put(b"".join(wanted), now)


class EventStreamResponse(StreamingResponse):
    """One client's stream: ``Hello``, then what the fan-out gives it, until it ends or the client
    leaves. Written by ``stream_response`` itself rather than from a body iterator, so that the
    client is forgotten the moment the response ends, even when it is cancelled mid-write."""

    def __init__(self, fan_out: EngineEventFanOut, client: StreamClient) -> None:
        super().__init__((), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.fan_out = fan_out
        self.client = client

    async def stream_response(self, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            while (data := await self.client.take()) is not None:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.fan_out.unsubscribe(self.client)
