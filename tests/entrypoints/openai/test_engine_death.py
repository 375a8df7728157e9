"""The server when its engine core dies, and the engine core when its server dies."""

from __future__ import annotations

import http.client
import json
import signal

import psutil
import pytest

from tests.server_utils import RemoteServer

pytestmark = pytest.mark.slow

SERVE_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--disable-log-stats"]


def test_engine_core_death_fails_requests_and_stops_the_server(bundled_model_dir):
    with RemoteServer(SERVE_ARGS) as server:
        engine_core = server.engine_core_process()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"}, body=json.dumps(
            {"prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True, "stream": True}))
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data: {")  # the request is running
        engine_core.send_signal(signal.SIGKILL)

        # The in-flight stream ends with an error event and [DONE] instead of hanging.
        rest = response.read().decode()
        events = [line.removeprefix("data: ") for line in rest.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and "engine core died" in error["message"]

        # /health says so while the server shuts itself down, and it exits with code 1.
        try:
            assert server.request("GET", "/health", timeout=5)[0] == 503
        except OSError:
            pass  # already gone
        assert server.proc.wait(30) == 1


def test_engine_core_exits_when_the_server_is_killed(bundled_model_dir):
    with RemoteServer(SERVE_ARGS) as server:
        engine_core = server.engine_core_process()
        server.proc.send_signal(signal.SIGKILL)  # no chance to clean up
        server.proc.wait(10)
        gone, alive = psutil.wait_procs([engine_core], timeout=15)
        assert engine_core in gone, "the EngineCore process outlived its parent"


def test_server_stops_its_engine_core_on_sigterm(bundled_model_dir):
    with RemoteServer(SERVE_ARGS) as server:
        engine_core = server.engine_core_process()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert not engine_core.is_running() or engine_core.status() == psutil.STATUS_ZOMBIE
