"""The live page's side server on a running vLLM: ``GET /ui`` and ``GET /v1/engine/events``, in a process
of its own, started by ``live.py`` in vLLM's engine core (the module that draws the two processes).

It is ``tracevllm serve``'s stream, but for the engine core: the same fan-out, responses, filters and
``Hello`` (``entrypoints/openai/engine_events.py``), fed by ``EngineCoreEvents``, which offers what
``AsyncMPClient`` offers the fan-out (``EngineEventSource``) over two sockets to the engine core::

    GET /v1/engine/events ─▶ EngineEventFanOut ─ publish_events_async ─▶ control PUSH ─▶ engine core
                                      ▲
                                      └────────── get_events_async ◀── events PULL ◀── EngineEventPublisher
    GET /ui, /ui/static/*  (mount_ui)          GET /health: 200 while the engine core lives

It imports no vLLM (``live.py`` runs this file by its path). It stops on SIGTERM (the scheduler's
``shutdown``), or by itself once the engine core that started it is gone (its parent process
changes): open streams then end with ``Dropped``, and the process exits.

    python live_server.py --fd FD --control ADDRESS --parent-pid PID --hello JSON
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
from typing import Annotated

import msgspec
import uvicorn
import zmq
import zmq.asyncio
from fastapi import FastAPI, Query, Response
from fastapi.responses import JSONResponse, RedirectResponse

from tracevllm.core.events import EngineEvent
from tracevllm.engine import PublishEvents
from tracevllm.engine.event_publisher import EVENTS_HWM, EventsHeader, decode_events
from tracevllm.engine.exceptions import EngineDeadError
from tracevllm.engine.snapshot import EngineSnapshot
from tracevllm.engine.utils import get_open_zmq_ipc_path, remove_ipc_files
from tracevllm.entrypoints.openai.engine_events import EngineEventFanOut, EventFilter, EventStreamResponse, Hello
from tracevllm.entrypoints.ui import UI_PATH, mount_ui

WATCH_S = 0.5  # how often the server looks whether the engine core still lives
POLL_MS = 500


class EngineCoreEvents:
    """The engine core's events, as ``AsyncMPClient`` offers them (``EngineEventSource``): this
    process binds the events socket and asks, on the engine core's control socket, to be sent to it."""

    def __init__(self, control_address: str, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self.ctx = zmq.asyncio.Context()
        self.control = self.ctx.socket(zmq.PUSH)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.connect(control_address)
        self.events_address = get_open_zmq_ipc_path("live-events")
        self.events = self.ctx.socket(zmq.PULL)
        self.events.setsockopt(zmq.RCVHWM, EVENTS_HWM)
        self.events.setsockopt(zmq.LINGER, 0)
        self.events.bind(self.events_address)
        self.encoder = msgspec.msgpack.Encoder()

    def alive(self) -> bool:
        """The engine core, this process's parent, still runs (once it is gone, the parent changes)."""
        return os.getppid() == self.parent_pid

    async def publish_events_async(self, session: int | None) -> None:
        if not self.alive():
            raise EngineDeadError("vLLM's engine core is gone.")
        address = None if session is None else self.events_address
        await self.control.send(self.encoder.encode(PublishEvents(address, session or 0)))

    async def get_events_async(self) -> tuple[EventsHeader, list[EngineEvent] | EngineSnapshot]:
        while not await self.events.poll(POLL_MS):
            if not self.alive():
                raise EngineDeadError("vLLM's engine core is gone.")
        return decode_events(await self.events.recv_multipart())

    def close(self) -> None:
        self.ctx.destroy(linger=0)
        remove_ipc_files(self.events_address)


def build_app(fan_out: EngineEventFanOut, engine_core: EngineCoreEvents) -> FastAPI:
    app = FastAPI(title="tracevllm live page (vLLM)", docs_url=None, redoc_url=None, openapi_url=None)
    mount_ui(app)

    @app.get("/v1/engine/events")
    async def engine_events(types: Annotated[list[str] | None, Query()] = None,
                            request_id: str | None = None) -> Response:
        try:
            event_filter = EventFilter.from_query(types, request_id)
        except ValueError as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error", "param": "types",
                                           "code": None}}, status_code=400)
        if not engine_core.alive() or fan_out.shut_down:
            return JSONResponse({"error": {"message": "vLLM's engine core is gone.", "type": "server_error",
                                           "param": None, "code": None}}, status_code=503)
        return EventStreamResponse(fan_out, fan_out.subscribe(event_filter))

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        return Response(status_code=200 if engine_core.alive() else 503)

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse(UI_PATH)

    return app


async def serve(sock: socket.socket, engine_core: EngineCoreEvents, hello: Hello) -> None:
    fan_out = EngineEventFanOut(engine_core, hello)
    server = uvicorn.Server(uvicorn.Config(build_app(fan_out, engine_core), log_level="warning",
                                           timeout_graceful_shutdown=1))

    async def watch() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        await engine_core.control.send(engine_core.encoder.encode(PublishEvents(None)))  # ready: live.py waits
        while engine_core.alive() and not server.should_exit:
            await asyncio.sleep(WATCH_S)
        if not engine_core.alive():
            fan_out.close("vLLM's engine core is gone.")  # each stream's last message: Dropped
        fan_out.shutdown()  # a stream never ends by itself: end them, so that the server can exit
        server.should_exit = True

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        engine_core.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, bound by the engine core")
    parser.add_argument("--control", required=True, help="the engine core's control socket (ZMQ)")
    parser.add_argument("--parent-pid", type=int, required=True, help="the engine core's process")
    parser.add_argument("--hello", required=True, help="the engine's Hello, as JSON")
    args = parser.parse_args()
    hello = msgspec.json.decode(args.hello, type=Hello)
    # uvicorn turns SIGTERM into a graceful shutdown, then raises it again with the handler found
    # before it: a no-op, so that the sockets are closed and their files removed.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    asyncio.run(serve(socket.socket(fileno=args.fd), EngineCoreEvents(args.control, args.parent_pid), hello))


if __name__ == "__main__":
    main()
