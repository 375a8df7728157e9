"""Starting, watching and stopping the engine-core process, and the ZMQ plumbing between the two.

Sockets (the client binds, the engine core connects; every message is ``[type, msgpack payload]``)::

    client (front end)                          EngineCore process
    input_socket   PUSH  ipc://…-input   ───▶   PULL  input thread  ──▶ input_queue  ──▶ busy loop
    output_socket  PULL  ipc://…-output  ◀───   PUSH  output thread ◀── output_queue ◀── busy loop
                                                      first message: READY (or FAILED + traceback)
    events_socket  PULL  ipc://…-events  ◀───   PUSH  busy loop (AsyncMPClient only, bound at the first
                                                      PUBLISH_EVENTS: engine/event_publisher.py)

An ``ipc://`` socket is a file, needed only until the engine core has connected: once the client has
READY on the output socket and sees a peer on the input socket, it unlinks both files (the connections
stay up; the events socket's file goes once its first message is in), so no file is left behind
however either process ends later. (ZMQ itself never unlinks them, not even on close.)

Neither side outlives the other unnoticed: the engine core holds the read end of a *death pipe*
whose write end only the parent has (a forked engine core closes its inherited copy at once), so the
pipe reads EOF the moment the parent dies (even by SIGKILL) and the engine core exits; the client
checks the process whenever it has waited ``POLL_MS`` for a message, so a dead engine core is an
error within moments instead of a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import signal
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import msgspec
import zmq

from tracevllm.config import VllmConfig
from tracevllm.engine import EngineCoreReadyResponse
from tracevllm.utils import describe_current_exception, get_mp_context, start_process

# First frame of the messages on the output socket.
OUTPUTS = b"OUTPUTS"  # payload: EngineCoreOutputs
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"  # payload: the traceback text, possibly empty
READY = b"READY"  # payload: EngineCoreReadyResponse
FAILED = b"FAILED"  # payload: describe_current_exception() of the start-up's exception

POLL_MS = 100  # how long a wait for a socket lasts before the engine core's process is checked
STARTUP_TIMEOUT_S = 600.0  # loading and converting a model on a slow CPU takes a while


def get_open_zmq_ipc_path(name: str) -> str:
    return f"ipc://{tempfile.gettempdir()}/tracevllm-{uuid.uuid4().hex[:12]}-{name}"


def remove_ipc_files(*addresses: str) -> None:
    for address in addresses:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address.removeprefix("ipc://"))


def make_zmq_socket(ctx: zmq.Context, path: str, socket_type: int, bind: bool) -> zmq.Socket:
    socket = ctx.socket(socket_type)
    socket.setsockopt(zmq.LINGER, 0 if bind else 2000)  # an engine core flushes what it has left
    if socket_type == zmq.PULL:
        socket.setsockopt(zmq.RCVHWM, 0)  # never drop or block on a burst of messages
    else:
        socket.setsockopt(zmq.SNDHWM, 0)
    if bind:
        socket.bind(path)
    else:
        socket.connect(path)
    return socket


def send_startup_failure(output_address: str) -> None:
    """From the engine-core process: tell the client why start-up failed (the current exception)."""
    ctx = zmq.Context()
    try:
        socket = make_zmq_socket(ctx, output_address, zmq.PUSH, bind=False)
        socket.send_multipart([FAILED, describe_current_exception().encode()])
        socket.close()  # lingers until the message is delivered
    finally:
        ctx.term()


class CoreEngineProcManager:
    """Owns the engine-core process: start, wait for READY, shut down.

    ``target`` runs in a process named ``EngineCore`` (forked or spawned: ``get_mp_context``) and is
    called as ``target(vllm_config=..., input_address=..., output_address=..., death_pipe=...,
    startup_trace_headers=...)``; it connects to the client's bound ``input_socket`` and
    ``output_socket`` (plain or asyncio ZMQ sockets).
    """

    def __init__(
        self, target: Callable, vllm_config: VllmConfig, input_socket: zmq.Socket, output_socket: zmq.Socket,
        startup_trace_headers: dict[str, str] | None = None,
    ) -> None:
        input_address, output_address = (s.getsockopt_string(zmq.LAST_ENDPOINT) for s in (input_socket, output_socket))
        ctx = get_mp_context()
        death_reader, self.death_writer = ctx.Pipe(duplex=False)
        multiprocessing.util.register_after_fork(self.death_writer, Connection.close)
        self.proc = ctx.Process(
            target=target,
            name="EngineCore",
            kwargs=dict(
                vllm_config=vllm_config, input_address=input_address, output_address=output_address,
                death_pipe=death_reader, startup_trace_headers=startup_trace_headers,
            ),
            daemon=True,
        )
        self._finalizer = weakref.finalize(self, _stop_process, self.proc, self.death_writer)
        try:
            start_process(self.proc)
            death_reader.close()  # only the child may hold the read end, or EOF never comes
            self.ready = self._wait_for_ready(zmq.Socket.shadow(input_socket.underlying),
                                              zmq.Socket.shadow(output_socket.underlying))
        except BaseException:
            self.shutdown()
            raise

    def _wait_for_ready(self, input_socket: zmq.Socket, output_socket: zmq.Socket) -> EngineCoreReadyResponse:
        """The first message on the output socket (READY, or FAILED with the reason), then a peer on
        the input socket: both connections are up. The sockets are blocking views (``shadow``) of
        the client's, which may be asyncio sockets."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not output_socket.poll(POLL_MS):
            self._check_starting(deadline)
        kind, payload = output_socket.recv_multipart()
        if kind == FAILED:
            raise RuntimeError(f"The engine core failed to start: {payload.decode()}")
        while not input_socket.poll(POLL_MS, zmq.POLLOUT):  # a bound PUSH is writable once a peer is connected
            self._check_starting(deadline)
        return msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)

    def _check_starting(self, deadline: float) -> None:
        if not self.proc.is_alive():
            raise RuntimeError(
                f"The engine core process (pid {self.proc.pid}) died during start-up with exit code "
                f"{self.proc.exitcode}, before it could say why; see its output above."
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"The engine core did not become ready within {STARTUP_TIMEOUT_S:.0f} s.")

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    def shutdown(self) -> None:
        self._finalizer()


def _stop_process(proc: BaseProcess, death_writer: Connection) -> None:
    """SIGTERM (the engine core exits its busy loop and flushes its traces), then SIGKILL after 5 s."""
    if proc.pid is not None and proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            os.kill(proc.pid, 9)
            proc.join()
    death_writer.close()


def exit_when_parent_dies(death_pipe: Connection) -> None:
    """In a thread of the engine-core process: SIGTERM this process once the death pipe reads EOF (the
    parent is gone)."""
    try:
        death_pipe.recv()
    except EOFError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # a process-directed signal: it unwinds the main thread
