"""The live page on a running vLLM: a side server, and the engine core's end of it.

With ``TRACEVLLM_LIVE_PORT`` set (beside ``TRACEVLLM_TRACE_DIR``), the ``TracingScheduler`` starts a
small server of its own, in a process of its own (``live_server.py``), serving what ``tracevllm serve``
serves of its engine: the page (``GET /ui``) and the stream it reads (``GET /v1/engine/events``: the
same messages and filters, ``entrypoints/openai/engine_events.py``). The two talk as ``tracevllm
serve``'s API server and engine core do (``engine/event_publisher.py``)::

    side server process (live_server.py)                   vLLM's engine core process
    EngineEventFanOut ── PublishEvents ── PUSH ──▶ PULL ── control thread: takes step_lock, so between
        ▲                                                  two steps (or while vLLM idles), then
        │                                                  EngineEventPublisher.control: attach to the
    events PULL ◀──────────────── PUSH ── EngineEventPublisher  recorder, send a snapshot (snapshot.py)
        (a snapshot, then a message a step)                 ▲ on_event: the recorder's events, while attached

Why a side server, not a file the page tails: the trace files hold spans, written in batches, a
request's only once it ends; the page wants each event as it happens, and a joining client wants the
engine's state now (a snapshot), which only the engine core can tell. Why a process, not a thread in
vLLM's engine core: serving HTTP and encoding JSON for each client would take the engine core's GIL
between its steps; the process costs the engine core one non-blocking send a step while someone
watches, and nothing when nobody does (the publisher is not attached). It is spawned, not forked (a
fork of a process holding a model and threads), and does not outlive the engine core: the scheduler's
``shutdown`` stops it, and it stops by itself once its parent is gone (``live_server.py``).

Why a thread for the control messages: vLLM's busy loop blocks while idle, calling no scheduler
method, and a client joining then must still get its ``Hello`` at once. The ``step_lock`` the
scheduler holds across each step and each change it takes from outside makes that thread's snapshot
one taken between steps.

Bad input stops vLLM's start-up: a port that is no number in 1-65535, or one that cannot be bound
(``ValueError``, naming ``TRACEVLLM_LIVE_PORT``); a side server that fails to start (``RuntimeError``).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import zmq

from tracevllm.engine import PublishEvents
from tracevllm.engine.event_publisher import EngineEventPublisher
from tracevllm.engine.utils import get_open_zmq_ipc_path, remove_ipc_files
from tracevllm.entrypoints.openai.engine_events import Hello
from tracevllm.vllm.snapshot import take_vllm_snapshot

if TYPE_CHECKING:
    from tracevllm.vllm.tracing_scheduler import TracingScheduler

logger = logging.getLogger("vllm.tracevllm")  # in vLLM's log, as vLLM writes it

LIVE_PORT_ENV = "TRACEVLLM_LIVE_PORT"
LIVE_HOST_ENV = "TRACEVLLM_LIVE_HOST"  # default 127.0.0.1: the stream carries no API key
STARTUP_TIMEOUT_S = 60.0
POLL_MS = 100
SERVER = Path(__file__).with_name("live_server.py")
# Run by path: `-m tracevllm.vllm.live_server` would import tracevllm.vllm first, and with it vLLM
# (4 s and 400 MB here), in a process that needs none of it.
RUN_SERVER = "import runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name='__main__')"


def live_socket() -> socket.socket | None:
    """The page's listening socket (``TRACEVLLM_LIVE_PORT``, bound now; None: unset), or ValueError."""
    text = os.environ.get(LIVE_PORT_ENV)
    if not text:
        return None
    port = int(text) if text.strip().isdigit() else -1
    if not 0 < port < 65536:
        raise ValueError(f"${LIVE_PORT_ENV}={text!r} is not a port: give a number from 1 to 65535 "
                         f"(e.g. {LIVE_PORT_ENV}=8011), or unset it for no live page")
    host = os.environ.get(LIVE_HOST_ENV) or "127.0.0.1"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ValueError(f"${LIVE_PORT_ENV}={text!r}: the live page cannot listen on {host}:{port} ({e.strerror}); "
                         "choose a free port") from e
    return sock


def vllm_hello(scheduler: TracingScheduler) -> Hello:
    """The Hello of a vLLM engine: its sizes (``step`` and the snapshot come with each client)."""
    config = scheduler.vllm_config
    return Hello(scheduler.kv_cache_manager.block_pool.num_gpu_blocks, scheduler.block_size,
                 scheduler.max_num_running_reqs, scheduler.max_num_scheduled_tokens,
                 str(config.model_config.served_model_name), jaeger_url=None, step=-1)


class LivePage:
    """The side server's process and the engine core's end of its two sockets (the module docstring)."""

    def __init__(self, scheduler: TracingScheduler, sock: socket.socket) -> None:
        self.scheduler = scheduler
        self.ctx = zmq.Context()
        self.control_address = get_open_zmq_ipc_path("live-control")
        self.control = self.ctx.socket(zmq.PULL)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.bind(self.control_address)
        self.publisher = EngineEventPublisher(self.ctx, take_vllm_snapshot)
        self.stopped = False
        host, port = sock.getsockname()[:2]
        self.server = subprocess.Popen(
            [sys.executable, "-c", RUN_SERVER, str(SERVER), "--fd", str(sock.fileno()), "--control",
             self.control_address, "--parent-pid", str(os.getpid()), "--hello",
             msgspec.json.encode(vllm_hello(scheduler)).decode()],
            pass_fds=(sock.fileno(),), start_new_session=True)  # a Ctrl-C to vLLM's group: vLLM stops it
        sock.close()  # the server's now
        self._wait_ready()
        logger.info("tracevllm's live page: http://%s:%d/ui", host, port)
        self.thread = threading.Thread(target=self._handle_control, name="TracevllmLiveControl", daemon=True)
        self.thread.start()

    def _wait_ready(self) -> None:
        """The server's first message (``PublishEvents(None)``: it serves, nobody watches yet)."""
        for _ in range(int(STARTUP_TIMEOUT_S * 1000 / POLL_MS)):
            if self.control.poll(POLL_MS):
                self.control.recv()
                return
            if self.server.poll() is not None:
                self.close()
                raise RuntimeError(f"tracevllm's live page server exited at start-up (code {self.server.returncode}); "
                                   "its error is above")
        self.close()
        raise RuntimeError(f"tracevllm's live page server did not start in {STARTUP_TIMEOUT_S:.0f} s")

    def _handle_control(self) -> None:
        """The control thread: each ``PublishEvents`` handled under ``step_lock``, between two steps."""
        decoder = msgspec.msgpack.Decoder(PublishEvents)
        try:
            while not self.stopped:
                if not self.control.poll(POLL_MS):
                    continue
                request = decoder.decode(self.control.recv())
                with self.scheduler.step_lock:
                    if self.stopped:
                        return
                    self.publisher.control(request, self.scheduler.recorder, self.scheduler)
        except zmq.ContextTerminated:  # closed while this thread waited for the lock
            pass
        except Exception:  # vLLM runs on; the page's clients hear nothing more
            logger.exception("tracevllm's live page: handling a client's PublishEvents failed")

    def close(self) -> None:
        """Stop listening and stop the server (vLLM's shutdown; its last events have been sent)."""
        self.stopped = True
        thread = getattr(self, "thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * POLL_MS / 1000)
        if self.publisher in self.scheduler.recorder.observers:
            self.scheduler.recorder.remove_observer(self.publisher)
        if self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        self.ctx.destroy(linger=0)
        remove_ipc_files(self.control_address)
