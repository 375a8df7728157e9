"""EngineCoreProc: the engine core in a background process of its own, and that process's entry point.

``AsyncMPClient`` and ``SyncMPClient`` (``core_client.py``) start ``run_engine_core`` in a child
process. It builds an ``EngineCoreProc`` (an ``EngineCore``, ``core.py``, plus the sockets) and runs its
busy loop until the client goes. vLLM keeps both classes in ``vllm/v1/engine/core.py``; here the
process, its threads and its sockets have a file of their own: a what-if replay, which steps an
``EngineCore`` of its own (``tracevllm/whatif/``), imports none of them.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection

import msgspec
import zmq

from tracevllm.config import VllmConfig
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.engine import (
    EngineCoreOutput, EngineCoreOutputs, EngineCoreReadyResponse, EngineCoreRequest, EngineCoreRequestType,
    FinishReason, FinishRequests, PublishEvents,
)
from tracevllm.engine.core import EngineCore
from tracevllm.engine.event_publisher import EngineEventPublisher
from tracevllm.engine.utils import (
    ENGINE_CORE_DEAD, OUTPUTS, READY, exit_when_parent_dies, make_zmq_socket, send_startup_failure,
)
from tracevllm.executor.abstract import Executor
from tracevllm.utils import set_process_title


class EngineCoreProc(EngineCore):
    """The engine core in its own process, fed and drained over ZMQ by socket threads.

    The busy loop (the main thread)::

        while True:
            _process_input_queue()    # idle: block for a message; then drain adds, aborts, PublishEvents
            _process_engine_step()    # step() and put its EngineCoreOutputs on the output queue

    The input thread receives and decodes messages into ``input_queue``; the output thread encodes
    and sends what the loop puts on ``output_queue``. Decoding and encoding thus overlap the model's
    forward pass (torch releases the GIL) instead of adding to each step.
    """

    def __init__(self, scheduler: Scheduler, model_executor: Executor, recorder: EventRecorder, input_address: str,
                 output_address: str) -> None:
        super().__init__(scheduler, model_executor, recorder)
        # (None, the exception) when the input thread failed to read a message (process_input_sockets).
        self.input_queue: queue.Queue[tuple[EngineCoreRequestType | None, object]] = queue.Queue()
        self.output_queue: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()
        # Aborts that arrive while the engine is idle change the KV cache without a step: the next
        # idle moment sends a stats-only output so the front end's gauges (KV usage) are current.
        self.stats_stale = False
        self.zmq_ctx = zmq.Context()
        self.event_publisher = EngineEventPublisher(self.zmq_ctx)  # observes while the API server streams events
        threading.Thread(target=self.process_input_sockets, args=(input_address,),
                         name="EngineCoreInput", daemon=True).start()
        self.output_thread = threading.Thread(target=self.process_output_sockets, args=(output_address,),
                                              name="EngineCoreOutput", daemon=True)
        self.output_thread.start()

    def ready_response(self) -> EngineCoreReadyResponse:
        return EngineCoreReadyResponse(self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks,
                                       self.scheduler.max_model_len, self.scheduler.max_num_batched_tokens)

    # ---- the busy loop (main thread) -----------------------------------------------------------

    def run_busy_loop(self) -> None:
        while True:
            self._process_input_queue()
            self._process_engine_step()

    def _process_input_queue(self) -> None:
        while not self.scheduler.has_unfinished_requests():
            if self.stats_stale:
                self._send_outputs(EngineCoreOutputs(scheduler_stats=self.scheduler.make_stats(), timestamp=time.time()))
                self.stats_stale = False
            self._handle_client_request(*self.input_queue.get())
        while True:
            try:
                self._handle_client_request(*self.input_queue.get_nowait())
            except queue.Empty:
                return

    def _handle_client_request(self, request_type: EngineCoreRequestType | None, payload) -> None:
        if request_type is None:
            raise RuntimeError("The engine core could not read a message from the front end.") from payload
        self.stats_stale = True
        if request_type == EngineCoreRequestType.ADD:
            try:
                self.add_request(payload)
            except ValueError as e:
                # A request the core refuses (a duplicate id, ...) fails alone: the loop goes on.
                error = EngineCoreOutput(payload.request_id, [], finish_reason=FinishReason.ERROR, stop_reason=str(e))
                self._send_outputs(EngineCoreOutputs(outputs=[error], timestamp=time.time()))
        elif request_type == EngineCoreRequestType.ABORT:
            self.abort_requests(payload.request_ids, payload.finish_reason)
        elif request_type == EngineCoreRequestType.PUBLISH_EVENTS:  # between steps (engine/event_publisher.py)
            self.event_publisher.control(payload, self.recorder, self.scheduler)

    def _process_engine_step(self) -> None:
        if not self.scheduler.has_unfinished_requests():
            return  # the inputs just drained aborted everything
        outputs = self.step_fn()
        if outputs is None:
            return  # a batch went in flight; its outputs come with a later call
        self.stats_stale = False
        self._send_outputs(outputs)

    def _send_outputs(self, outputs: EngineCoreOutputs) -> None:
        self.output_queue.put((OUTPUTS, msgspec.msgpack.encode(outputs)))

    def send_engine_dead(self, detail: str) -> None:
        """Tell the client the busy loop is gone, and wait (briefly) until the message is sent."""
        self.output_queue.put((ENGINE_CORE_DEAD, detail.encode()))
        self.output_queue.put(None)
        self.output_thread.join(timeout=5)

    # ---- socket threads ------------------------------------------------------------------------

    def process_input_sockets(self, input_address: str) -> None:
        socket = make_zmq_socket(self.zmq_ctx, input_address, zmq.PULL, bind=False)
        decoders = {EngineCoreRequestType.ADD: msgspec.msgpack.Decoder(EngineCoreRequest),
                    EngineCoreRequestType.ABORT: msgspec.msgpack.Decoder(FinishRequests),
                    EngineCoreRequestType.PUBLISH_EVENTS: msgspec.msgpack.Decoder(PublishEvents)}
        while True:
            try:
                kind, payload = socket.recv_multipart()
                request_type = EngineCoreRequestType(kind)
                self.input_queue.put((request_type, decoders[request_type].decode(payload)))
            except Exception as e:
                # A message the core cannot read is the front end's bug, not a client's. The busy
                # loop dies of it, so the front end learns the engine is dead, rather than this
                # thread dying alone and the engine waiting for input forever.
                self.input_queue.put((None, e))
                return

    def process_output_sockets(self, output_address: str) -> None:
        socket = make_zmq_socket(self.zmq_ctx, output_address, zmq.PUSH, bind=False)
        while (message := self.output_queue.get()) is not None:
            socket.send_multipart(message)
        socket.close()  # lingers until what was sent is delivered


def run_engine_core(
    vllm_config: VllmConfig, input_address: str, output_address: str, death_pipe: Connection,
    startup_trace_headers: dict[str, str] | None = None,
) -> None:
    """Entry point of the ``EngineCore`` process (see ``engine/utils.py`` for the sockets)."""

    def signal_handler(signum, frame):
        # Once: a second signal (SIGTERM from the parent after the death pipe's) must not interrupt
        # the shutdown below, in which the observers complete their trace files.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(0)

    set_process_title("EngineCore")
    # Started as a daemon (so that it never outlives the client), it may still start worker
    # processes: it stops them itself (the executor's finalizer, and their death pipes).
    multiprocessing.current_process().daemon = False
    signal.signal(signal.SIGTERM, signal_handler)
    signal.signal(signal.SIGINT, signal_handler)
    threading.Thread(target=exit_when_parent_dies, args=(death_pipe,), daemon=True).start()

    try:
        engine_core = EngineCoreProc.from_config(vllm_config, startup_trace_headers, input_address=input_address,
                                                 output_address=output_address)
    except Exception:
        send_startup_failure(output_address)
        raise SystemExit(1)
    # The first message on the output socket: when the client has it, the socket is connected.
    engine_core.output_queue.put((READY, msgspec.msgpack.encode(engine_core.ready_response())))

    try:
        engine_core.run_busy_loop()
    except SystemExit:
        raise
    except BaseException:
        engine_core.send_engine_dead(traceback.format_exc())
        raise SystemExit(1)
    finally:
        # Stop the workers through their death pipes, so that they exit their own way, before this
        # process's exit would SIGTERM them (multiprocessing does so to daemon children). A child
        # process runs no atexit hook: the core's observers complete their output in shutdown().
        engine_core.shutdown()
