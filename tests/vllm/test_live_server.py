"""The live page's side server (``tracevllm/vllm/live_server.py``) without vLLM: a stand-in engine core
(a parent process with the two sockets ``live.py`` binds) starts it as ``live.py`` does, answers a
client's ``PublishEvents`` with a snapshot, then is killed: the side server ends the client's stream
with ``Dropped`` and exits by itself, leaving its port free. ``test_vllm_live.py`` runs it inside vLLM."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

ENGINE_CORE = textwrap.dedent("""
    import os, socket, subprocess, sys, time
    import msgspec, zmq
    from tracevllm.engine import PublishEvents
    from tracevllm.engine.event_publisher import EventsHeader
    from tracevllm.engine.snapshot import EngineSnapshot, RequestSnapshot
    from tracevllm.engine.utils import get_open_zmq_ipc_path
    from tracevllm.entrypoints.openai.engine_events import Hello

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as live.py binds it
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    ctx = zmq.Context()
    control_address = get_open_zmq_ipc_path("live-control")
    control = ctx.socket(zmq.PULL)
    control.bind(control_address)
    run = "import runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name='__main__')"  # live.py's
    hello = Hello(64, 16, 8, 256, "stand-in", None, -1)
    server = subprocess.Popen([sys.executable, "-c", run, "tracevllm/vllm/live_server.py", "--fd", str(sock.fileno()),
                               "--control", control_address, "--parent-pid", str(os.getpid()),
                               "--hello", msgspec.json.encode(hello).decode()],
                              pass_fds=(sock.fileno(),), start_new_session=True)
    assert control.poll(30000), "the side server did not say it is ready"
    assert msgspec.msgpack.decode(control.recv(), type=PublishEvents).address is None
    print(sock.getsockname()[1], server.pid, flush=True)
    request = msgspec.msgpack.decode(control.recv(), type=PublishEvents)  # a client joined
    push = ctx.socket(zmq.PUSH)
    push.connect(request.address)
    snapshot = EngineSnapshot([RequestSnapshot("r1", "running", 1.0, 20, 20, 0, 3, 0, [1, 2])], [1])
    push.send_multipart([msgspec.msgpack.encode(EventsHeader(request.session, 7, snapshot=True)),
                         msgspec.msgpack.encode(snapshot)])
    time.sleep(600)
""")


def test_the_side_server_serves_the_stream_and_stops_when_its_engine_core_dies():
    engine_core = subprocess.Popen([sys.executable, "-c", ENGINE_CORE], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port, server_pid = map(int, engine_core.stdout.readline().split())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/health")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b""
        conn.request("GET", "/ui")
        response = conn.getresponse()
        assert response.status == 200 and b"<html" in response.read().lower()

        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        stream.request("GET", "/v1/engine/events")
        body = stream.getresponse()
        hello = json.loads(body.readline().removeprefix(b"data: "))
        assert (hello["type"], hello["source"], hello["model"], hello["step"]) == ("Hello", "live", "stand-in", 7)
        assert hello["snapshot"]["requests"][0]["block_ids"] == [1, 2]

        start = time.monotonic()
        engine_core.send_signal(signal.SIGKILL)  # vLLM's engine core killed: nobody stops the side server
        engine_core.wait()
        rest = body.read()  # the stream ends
        assert b'"Dropped"' in rest and b"engine core" in rest, rest
        while psutil.pid_exists(server_pid) and psutil.Process(server_pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() - start < 10, "the side server outlived its engine core"
            time.sleep(0.05)
        conn.close()
        stream.close()
        with socket.socket() as s:  # nothing listens on the port any more
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:
        if engine_core.poll() is None:
            engine_core.kill()
            engine_core.wait()
