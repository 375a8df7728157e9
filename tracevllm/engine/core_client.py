"""EngineCoreClient: how the front end reaches the EngineCore.

``make_client(multiprocess_mode, asyncio_mode)`` picks the transport:

- ``InprocClient``: the core lives in this process; ``get_output()`` is one ``EngineCore.step()``.
- ``SyncMPClient``: the core runs its busy loop in a background ``EngineCore`` process; requests go
  out and outputs come back over ZMQ as msgpack (``engine/utils.py`` draws the sockets). The
  offline ``LLM(multiprocess=True)`` uses it.
- ``AsyncMPClient``: the same, with asyncio sockets, for ``AsyncLLM`` and the server.

The multi-process clients raise ``EngineDeadError`` from ``get_output`` once the core has died.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import msgspec
import zmq
import zmq.asyncio

from tracevllm.config import VllmConfig
from tracevllm.core.events import EngineEvent
from tracevllm.engine import (
    EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType, FinishReason, FinishRequests, PublishEvents,
)
from tracevllm.engine.core import EngineCore
from tracevllm.engine.core_proc import run_engine_core
from tracevllm.engine.event_publisher import EVENTS_HWM, EventsHeader, decode_events
from tracevllm.engine.snapshot import EngineSnapshot
from tracevllm.engine.exceptions import EngineDeadError
from tracevllm.engine.utils import (
    ENGINE_CORE_DEAD, POLL_MS, CoreEngineProcManager, get_open_zmq_ipc_path, make_zmq_socket, remove_ipc_files,
)


class EngineCoreClient(ABC):
    @staticmethod
    def make_client(multiprocess_mode: bool, asyncio_mode: bool, vllm_config: VllmConfig,
                    startup_trace_headers: dict[str, str] | None = None) -> "EngineCoreClient":
        """``startup_trace_headers``: the front end's start-up span, for the engine core's start-up trace."""
        if asyncio_mode:
            if not multiprocess_mode:
                raise ValueError("The asyncio engine core client runs the engine core in its own process.")
            return AsyncMPClient(vllm_config, startup_trace_headers)
        if multiprocess_mode:
            return SyncMPClient(vllm_config, startup_trace_headers)
        return InprocClient(vllm_config, startup_trace_headers)

    def get_output(self) -> EngineCoreOutputs:
        """Run (or wait for) one engine step and return its outputs."""
        raise NotImplementedError

    def add_request(self, request: EngineCoreRequest) -> None:
        raise NotImplementedError

    def abort_requests(self, request_ids: list[str], finish_reason: FinishReason = FinishReason.ABORT) -> None:
        """End requests in the engine core: aborted, or (``STOP``) stopped by a stop string."""
        raise NotImplementedError

    @abstractmethod
    def shutdown(self) -> None:
        """Release the engine core (its process, for the multi-process clients)."""


class InprocClient(EngineCoreClient):
    """The engine core in the caller's process: ``get_output()`` is one ``EngineCore.step()`` (with
    more than one batch in flight, one call of ``step_with_batch_queue()``, whose outputs are empty
    when it only put a batch in flight, as vLLM's ``InprocClient``)."""

    def __init__(self, vllm_config: VllmConfig, startup_trace_headers: dict[str, str] | None = None) -> None:
        self.engine_core = EngineCore.from_config(vllm_config, startup_trace_headers)

    def get_output(self) -> EngineCoreOutputs:
        outputs = self.engine_core.step_fn()
        return EngineCoreOutputs(timestamp=time.time()) if outputs is None else outputs

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str], finish_reason: FinishReason = FinishReason.ABORT) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids, finish_reason)

    def shutdown(self) -> None:
        self.engine_core.shutdown()


class MPClient(EngineCoreClient):
    """Starts the ``EngineCore`` process and binds the sockets it connects to.

    The constructor returns once the engine core is READY (model loaded, KV cache sized) and its
    socket files are gone, and raises with the engine core's own exception if it failed to start.
    A wait for an output or for room to send lasts ``POLL_MS`` at a time, between which the process
    is checked: a dead engine core raises ``EngineDeadError`` instead of leaving the caller hanging.
    """

    def __init__(self, vllm_config: VllmConfig, ctx: zmq.Context, startup_trace_headers: dict[str, str] | None) -> None:
        self.ctx = ctx
        input_address = get_open_zmq_ipc_path("input")
        output_address = get_open_zmq_ipc_path("output")
        self.input_socket = make_zmq_socket(ctx, input_address, zmq.PUSH, bind=True)
        self.output_socket = make_zmq_socket(ctx, output_address, zmq.PULL, bind=True)
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self.engine_dead: EngineDeadError | None = None
        try:
            self.proc_manager = CoreEngineProcManager(
                run_engine_core, vllm_config, self.input_socket, self.output_socket, startup_trace_headers
            )
        except BaseException:
            self._close_sockets()
            raise
        finally:
            remove_ipc_files(input_address, output_address)  # connected, or never to be: not needed any more
        self.num_gpu_blocks = self.proc_manager.ready.num_gpu_blocks
        self.max_num_batched_tokens = self.proc_manager.ready.max_num_batched_tokens

    def _decode(self, kind: bytes, payload: bytes) -> EngineCoreOutputs:
        if kind == ENGINE_CORE_DEAD:
            self.engine_dead = EngineDeadError(payload.decode())
            raise self.engine_dead
        return self.decoder.decode(payload)

    def _encode_abort(self, request_ids: list[str], finish_reason: FinishReason) -> list[bytes]:
        return [EngineCoreRequestType.ABORT.value, self.encoder.encode(FinishRequests(request_ids, finish_reason))]

    def _encode_add(self, request: EngineCoreRequest) -> list[bytes]:
        return [EngineCoreRequestType.ADD.value, self.encoder.encode(request)]

    def _check_alive(self) -> None:
        """Raise EngineDeadError if the engine core is known to be gone, or its process is."""
        if self.engine_dead is None and not self.proc_manager.is_alive():
            proc = self.proc_manager.proc
            self.engine_dead = self._last_words() or EngineDeadError(
                f"The EngineCore process (pid {proc.pid}) exited with code {proc.exitcode}.")
        if self.engine_dead is not None:
            raise self.engine_dead

    def _last_words(self) -> EngineDeadError | None:
        """The ENGINE_CORE_DEAD message a dead engine core left unread, read without waiting.

        A send can find the process gone before any read has reached its last message: the cause
        (its traceback) is in the output socket, behind outputs nobody will be served any more.
        """
        socket = zmq.Socket.shadow(self.output_socket.underlying)  # a plain view, for the asyncio socket too
        while socket.poll(0):
            kind, payload = socket.recv_multipart()
            if kind == ENGINE_CORE_DEAD:
                return EngineDeadError(payload.decode())
        return None

    def shutdown(self) -> None:
        self.proc_manager.shutdown()
        self._close_sockets()

    def _close_sockets(self) -> None:
        self.input_socket.close()
        self.output_socket.close()
        self.ctx.term()


class SyncMPClient(MPClient):
    def __init__(self, vllm_config: VllmConfig, startup_trace_headers: dict[str, str] | None = None) -> None:
        super().__init__(vllm_config, zmq.Context(), startup_trace_headers)

    def get_output(self) -> EngineCoreOutputs:
        # The process is checked before each wait: what it sent before it died (ENGINE_CORE_DEAD with
        # its traceback) has arrived by the end of the wait, and is read first.
        if self.engine_dead is not None:
            raise self.engine_dead
        while True:
            was_alive = self.proc_manager.is_alive()
            if self.output_socket.poll(POLL_MS):
                return self._decode(*self.output_socket.recv_multipart())
            if not was_alive:
                self._check_alive()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(self._encode_add(request))

    def abort_requests(self, request_ids: list[str], finish_reason: FinishReason = FinishReason.ABORT) -> None:
        if request_ids and self.engine_dead is None:
            try:
                self._send(self._encode_abort(request_ids, finish_reason))
            except EngineDeadError:
                pass  # a dead engine core holds nothing left to abort

    def _send(self, message: list[bytes]) -> None:
        # A PUSH socket blocks while no engine core is connected: wait in short polls, checking that
        # the engine core is still alive, rather than forever.
        while not self.input_socket.poll(POLL_MS, zmq.POLLOUT):
            self._check_alive()
        self.input_socket.send_multipart(message)


class AsyncMPClient(MPClient):
    """The asyncio client: every call is a coroutine; sockets are ``zmq.asyncio`` sockets. The server's
    ``/v1/engine/events`` also reads the engine core's events through it, on a socket of their own."""

    def __init__(self, vllm_config: VllmConfig, startup_trace_headers: dict[str, str] | None = None) -> None:
        self.events_socket: zmq.asyncio.Socket | None = None  # bound at its first use
        self.events_address = ""
        self.events_connected = False
        super().__init__(vllm_config, zmq.asyncio.Context(), startup_trace_headers)

    async def get_output_async(self) -> EngineCoreOutputs:
        if self.engine_dead is not None:  # as get_output
            raise self.engine_dead
        while True:
            was_alive = self.proc_manager.is_alive()
            if await self.output_socket.poll(POLL_MS):
                return self._decode(*await self.output_socket.recv_multipart())
            if not was_alive:
                self._check_alive()

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        await self._send_async(self._encode_add(request))

    async def abort_requests_async(self, request_ids: list[str],
                                   finish_reason: FinishReason = FinishReason.ABORT) -> None:
        if request_ids and self.engine_dead is None:
            try:
                await self._send_async(self._encode_abort(request_ids, finish_reason))
            except EngineDeadError:
                pass  # a dead engine core holds nothing left to abort

    async def _send_async(self, message: list[bytes]) -> None:
        while not await self.input_socket.poll(POLL_MS, zmq.POLLOUT):
            self._check_alive()
        await self.input_socket.send_multipart(message)

    def is_alive(self) -> bool:
        return self.engine_dead is None and self.proc_manager.is_alive()

    def _close_sockets(self) -> None:
        if self.events_socket is not None:
            self.events_socket.close()
            remove_ipc_files(self.events_address)
        super()._close_sockets()

    # ---- the engine core's events (engine/event_publisher.py) --------------------------------------

    def _bound_events_socket(self) -> zmq.asyncio.Socket:
        """The events socket, bound at its first use."""
        if self.events_socket is None:
            self.events_address = get_open_zmq_ipc_path("events")
            self.events_socket = self.ctx.socket(zmq.PULL)
            self.events_socket.setsockopt(zmq.RCVHWM, EVENTS_HWM)
            self.events_socket.setsockopt(zmq.LINGER, 0)
            self.events_socket.bind(self.events_address)
        return self.events_socket

    async def publish_events_async(self, session: int | None) -> None:
        """Ask the engine core to publish its events to the events socket as ``session``, or (None) to
        stop."""
        self._bound_events_socket()
        address = None if session is None else self.events_address
        await self._send_async([EngineCoreRequestType.PUBLISH_EVENTS.value,
                                self.encoder.encode(PublishEvents(address, session or 0))])

    async def get_events_async(self) -> tuple[EventsHeader, list[EngineEvent] | EngineSnapshot]:
        """The next message of the events socket (its events, or a snapshot); EngineDeadError once the
        engine core is gone."""
        socket = self._bound_events_socket()
        while not await socket.poll(POLL_MS):
            self._check_alive()
        frames = await socket.recv_multipart()
        if not self.events_connected:  # the engine core is connected, for good: the file is not needed any more
            remove_ipc_files(self.events_address)
            self.events_connected = True
        return decode_events(frames)

