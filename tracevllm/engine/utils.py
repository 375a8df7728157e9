"""Starting, watching and stopping the engine-core process, and the ZMQ plumbing between the two.

Sockets (the client binds, the engine core connects; every message is ``[type, msgpack payload]``)::

    client (front end)                          EngineCore process
    input_socket   PUSH  ipc://…-input   ───▶   PULL  input thread  ──▶ input_queue  ──▶ busy loop
    output_socket  PULL  ipc://…-output  ◀───   PUSH  output thread ◀── output_queue ◀── busy loop
    handshake      PULL  ipc://…-hs      ◀───   PUSH  READY (or FAILED + traceback), once at start-up

Neither side outlives the other unnoticed: the engine core holds the read end of a *death pipe*
whose write end only the parent has, so the pipe reads EOF the moment the parent dies (even by
SIGKILL) and the engine core exits; the parent watches the process's sentinel and, when the process
dies, pushes an ENGINE_CORE_DEAD message to its own output socket so that whoever waits for outputs
wakes up with an error instead of hanging.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import traceback
import uuid
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

import msgspec
import zmq

from tracevllm.config import VllmConfig
from tracevllm.engine import EngineCoreReadyResponse

# First frame of the messages on the output and handshake sockets.
OUTPUTS = b"OUTPUTS"  # payload: EngineCoreOutputs
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"  # payload: the traceback text, possibly empty
READY = b"READY"  # payload: EngineCoreReadyResponse
FAILED = b"FAILED"  # payload: the start-up traceback text

STARTUP_TIMEOUT_S = 600.0  # loading and converting a model on a slow CPU takes a while


def get_open_zmq_ipc_path(name: str) -> str:
    return f"ipc://{tempfile.gettempdir()}/tracevllm-{uuid.uuid4().hex[:12]}-{name}"


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


def set_process_title(title: str) -> None:
    """So that ``ps`` and ``top`` show the process by its role (Linux; elsewhere a no-op)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(title)
    except OSError:
        pass


def send_startup_failure(handshake_address: str) -> None:
    """From the engine-core process: tell the client why start-up failed (the current exception)."""
    ctx = zmq.Context()
    try:
        socket = make_zmq_socket(ctx, handshake_address, zmq.PUSH, bind=False)
        socket.send_multipart([FAILED, traceback.format_exc().encode()])
        socket.close()  # lingers until the message is delivered
    finally:
        ctx.term()


class CoreEngineProcManager:
    """Owns the engine-core process: start, wait for READY, watch for death, shut down.

    ``target`` runs in a spawned process named ``EngineCore`` and is called as
    ``target(vllm_config=..., input_address=..., output_address=..., handshake_address=...,
    death_pipe=..., startup_trace_headers=...)``.
    """

    def __init__(
        self, target: Callable, vllm_config: VllmConfig, input_address: str, output_address: str,
        startup_trace_headers: dict[str, str] | None = None,
    ) -> None:
        self.output_address = output_address
        handshake_address = get_open_zmq_ipc_path("handshake")
        ctx = multiprocessing.get_context("spawn")
        death_reader, self.death_writer = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=target,
            name="EngineCore",
            kwargs=dict(
                vllm_config=vllm_config, input_address=input_address, output_address=output_address,
                handshake_address=handshake_address, death_pipe=death_reader,
                startup_trace_headers=startup_trace_headers,
            ),
            daemon=True,
        )
        zmq_ctx = zmq.Context()
        handshake = make_zmq_socket(zmq_ctx, handshake_address, zmq.PULL, bind=True)
        try:
            self.proc.start()
            death_reader.close()  # only the child may hold the read end, or EOF never comes
            self.ready = self._wait_for_ready(handshake)
        except BaseException:
            self.shutdown()
            raise
        finally:
            handshake.close()
            zmq_ctx.term()
        self._shutting_down = threading.Event()
        self._finalizer = weakref.finalize(self, _stop_process, self.proc, self.death_writer)
        threading.Thread(
            target=_monitor_engine_core, args=(self.proc, output_address, self._shutting_down),
            name="EngineCoreMonitor", daemon=True,
        ).start()

    def _wait_for_ready(self, handshake: zmq.Socket) -> EngineCoreReadyResponse:
        poller = zmq.Poller()
        poller.register(handshake, zmq.POLLIN)
        waited = 0.0
        while not poller.poll(timeout=100):
            waited += 0.1
            if not self.proc.is_alive():
                raise RuntimeError(
                    f"The engine core process died during start-up (exit code {self.proc.exitcode}) "
                    "without saying why; see its output above. It is started with the 'spawn' method, "
                    "which imports your main module again: a script must create the engine under "
                    "`if __name__ == '__main__':`."
                )
            if waited > STARTUP_TIMEOUT_S:
                raise RuntimeError(f"The engine core did not become ready within {STARTUP_TIMEOUT_S:.0f} s.")
        kind, payload = handshake.recv_multipart()
        if kind == FAILED:
            raise RuntimeError(f"The engine core failed to start:\n{payload.decode()}")
        return msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    def shutdown(self) -> None:
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is None:  # start-up failed
            _stop_process(self.proc, self.death_writer)
            return
        self._shutting_down.set()
        finalizer()


def _monitor_engine_core(proc: multiprocessing.Process, output_address: str, shutting_down: threading.Event) -> None:
    """Wake the output socket's reader with ENGINE_CORE_DEAD if the process dies under us."""
    wait([proc.sentinel])
    if shutting_down.is_set():
        return
    ctx = zmq.Context()
    try:
        socket = make_zmq_socket(ctx, output_address, zmq.PUSH, bind=False)
        detail = f"The EngineCore process (pid {proc.pid}) exited with code {proc.exitcode}."
        socket.send_multipart([ENGINE_CORE_DEAD, detail.encode()])
        socket.close()
    finally:
        ctx.term()


def _stop_process(proc: multiprocessing.Process, death_writer: Connection) -> None:
    """SIGTERM (the engine core exits its busy loop and flushes its traces), then SIGKILL after 5 s."""
    if proc.pid is not None and proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            os.kill(proc.pid, 9)
            proc.join()
    death_writer.close()

