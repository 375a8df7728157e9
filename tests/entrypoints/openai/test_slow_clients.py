"""``tracevllm serve`` against clients that stall, send huge prompts, or hold a stream at exit: a request
head or body that has not arrived within ``--read-timeout`` is cut off (the body with a 408 in OpenAI's
shape); four 4 MB prompts are refused by their size before the tokenizer runs, while a small request
is answered as fast as before and ``/health`` stays fast; and SIGTERM with streams in flight exits
within ``--shutdown-timeout``, each stream ended with an error event and ``[DONE]``. Real HTTP and raw
sockets, on a tiny random-weight Llama."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import statistics
import threading
import time

import psutil
import pytest

from tests.server_utils import RemoteServer
from tests.trace_utils import attrs, load_spans

pytestmark = pytest.mark.slow

READ_TIMEOUT = 2.0
SERVE_ARGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "1024", "--disable-log-stats",
              "--uvicorn-log-level", "warning"]


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    args = [tiny_checkpoint("llama"), *SERVE_ARGS, "--read-timeout", str(READ_TIMEOUT),
            "--max-request-body-bytes", str(16 * 1024 * 1024)]
    with RemoteServer(args) as server:
        yield server


def assert_health_fast(server) -> None:
    start = time.perf_counter()
    assert server.request("GET", "/health", timeout=5)[0] == 200
    assert time.perf_counter() - start < 1.0


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


# ---- --read-timeout -----------------------------------------------------------------------------------

def test_partial_request_heads_are_closed_within_the_read_timeout(server):
    """Nothing sent, half a request line, half the headers, and half the next request's head on a
    keep-alive connection: each connection is closed, unanswered, about READ_TIMEOUT s after it began
    (or after the previous response); meanwhile other clients are served."""
    heads = [b"", b"GET /hea", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"]
    socks = []
    for head in heads:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=READ_TIMEOUT + 10)
        sock.sendall(head)
        socks.append((sock, time.perf_counter()))
    keep_alive = socket.create_connection(("127.0.0.1", server.port), timeout=READ_TIMEOUT + 10)
    keep_alive.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert keep_alive.recv(65536).startswith(b"HTTP/1.1 200")
    keep_alive.sendall(b"GET /health HTTP/1.1\r\nHo")
    socks.append((keep_alive, time.perf_counter()))
    assert_health_fast(server)
    for sock, started in socks:
        assert read_until_closed(sock) == b""
        assert READ_TIMEOUT - 0.5 < time.perf_counter() - started < READ_TIMEOUT + 3
        sock.close()


def test_partial_body_is_408_within_the_read_timeout(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=READ_TIMEOUT + 10)
    started = time.perf_counter()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n" + b'{"prompt":')  # 10 bytes of 100
    assert_health_fast(server)
    response = read_until_closed(sock)
    assert READ_TIMEOUT - 0.5 < time.perf_counter() - started < READ_TIMEOUT + 3
    sock.close()
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), response
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and "--read-timeout" in error["message"], error
    assert_health_fast(server)


# ---- huge prompts -----------------------------------------------------------------------------------------

def small_request_latency(server) -> float:
    start = time.perf_counter()
    status, body = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 200, body
    return time.perf_counter() - start


def test_huge_prompts_are_refused_by_size_and_do_not_delay_small_requests(server):
    """Four concurrent 4 MB prompts (under the body limit): each a 400 naming ``prompt`` within a few
    seconds (before, the tokenizer took 8-14 s on each, and held every tokenizer thread), while a
    small request is answered within 1 s of its time on an idle server."""
    baseline = statistics.median(small_request_latency(server) for _ in range(3))
    huge = json.dumps({"prompt": "word " * (800 * 1024), "max_tokens": 2})
    answers: list[tuple[int, bytes, float]] = []

    def send_huge() -> None:
        start = time.perf_counter()
        status, body = server.request("POST", "/v1/completions", huge, timeout=120)
        answers.append((status, body, time.perf_counter() - start))

    threads = [threading.Thread(target=send_huge) for _ in range(4)]
    for thread in threads:
        thread.start()
    latencies = []
    while any(thread.is_alive() for thread in threads):
        latencies.append(small_request_latency(server))
        assert_health_fast(server)
    for thread in threads:
        thread.join()
    assert len(answers) == 4
    for status, body, seconds in answers:
        error = json.loads(body)["error"]
        assert status == 400 and error["param"] == "prompt" and "bytes" in error["message"], body
        assert seconds < 5.0, seconds
    assert max(latencies) < baseline + 1.0, (baseline, latencies)


# ---- invalid values over real HTTP ---------------------------------------------------------------------------

def test_lone_surrogate_model_and_int_overflow_are_400s(server):
    routes = {"/v1/completions": {"prompt": "Hi", "max_tokens": 2},
              "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
              "/tokenize": {"prompt": "Hi"}, "/detokenize": {"tokens": [1]}}
    for path, body in routes.items():
        status, raw = server.request("POST", path, json.dumps({**body, "model": "\ud800"}))
        assert status == 400 and json.loads(raw)["error"]["param"] == "model", raw
    for field, value in (("top_k", 2**64), ("priority", 2**64), ("stop_token_ids", [2**64])):
        status, raw = server.request("POST", "/v1/completions", {**routes["/v1/completions"], field: value})
        assert status == 400 and json.loads(raw)["error"]["param"] == field, raw
    assert_health_fast(server)


# ---- --shutdown-timeout ----------------------------------------------------------------------------------------

def test_sigterm_with_a_stream_in_flight_exits_within_the_shutdown_timeout(tiny_checkpoint):
    with RemoteServer([tiny_checkpoint("llama"), *SERVE_ARGS, "--shutdown-timeout", "1"]) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {"prompt": "Once upon a time", "max_tokens": 1000, "n": 8, "ignore_eos": True, "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: {")
        started = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert time.perf_counter() - started < 1.0 + 10.0  # the drain, then the engine core's shutdown
        rest = response.read()
        # Not the stream's own end: it was stopped, and said so (test_sigterm_ends_every_stream_...).
        assert b"shutting down" in rest and b'"finish_reason":"length"' not in rest
        conn.close()


def sse_events(raw: bytes) -> list[bytes]:
    return [line.removeprefix(b"data: ") for line in raw.splitlines() if line.startswith(b"data: ")]


def test_sigterm_ends_every_stream_with_an_error_and_done(tiny_checkpoint, tmp_path):
    """Issue 48: with streams in flight, SIGTERM cut them mid-body (RemoteProtocolError). Now each one
    still running at the drain's deadline ends with an error event and [DONE], a plain request gets a
    503, the server exits 0 leaving no process behind, and every request's span ends as aborted."""
    trace_dir = tmp_path / "traces"
    # Long enough that no stream ends by itself before the drain's deadline, even on a fast machine.
    with RemoteServer([tiny_checkpoint("llama", max_position_embeddings=8192), *SERVE_ARGS, "--max-model-len", "8192",
                       "--shutdown-timeout", "2", "--trace-out", str(trace_dir)]) as server:
        engine_core = server.engine_core_process()
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": True}
        streams = []
        for i in range(8):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            route, request = (("/v1/completions", {**body, "stream": True}) if i % 2 else ("/v1/chat/completions", {
                "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8000,
                "ignore_eos": True, "stream": True}))
            conn.request("POST", route, json.dumps(request), {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200 and response.readline().startswith(b"data: {")
            streams.append((conn, response))
        plain: dict = {}
        waiting = threading.Thread(target=lambda: plain.update(result=server.request(
            "POST", "/v1/completions", body, timeout=60)))
        waiting.start()
        time.sleep(0.5)  # the plain request is in the engine too
        started = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        for conn, response in streams:
            events = sse_events(response.read())  # whole: no IncompleteRead, no RemoteProtocolError
            assert events[-1] == b"[DONE]", events[-3:]
            error = json.loads(events[-2])["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "server_error" and "shutting down" in error["message"], error
            assert not any(b'"finish_reason":"length"' in e for e in events)  # stopped, not finished
            conn.close()
        waiting.join(30)
        status, raw = plain["result"]
        assert status == 503 and "shutting down" in json.loads(raw)["error"]["message"], raw
        assert server.proc.wait(30) == 0
        assert time.perf_counter() - started < 2.0 + 10.0  # the drain, then the engine core's shutdown
        gone, alive = psutil.wait_procs([engine_core], timeout=15)
        assert not alive, "the EngineCore process outlived the server"
    finished = [attrs(s) for s in load_spans(trace_dir) if s["name"] == "llm_request"]
    assert len(finished) == 9
    assert all(a["gen_ai.response.finish_reasons"] == ["abort"] for a in finished), finished
