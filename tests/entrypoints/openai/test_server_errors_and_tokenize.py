"""``tracevllm serve``: /tokenize and /detokenize, every bad input answered in OpenAI's error shape,
huge bodies refused without stalling other clients, and the start-up lines. Real HTTP throughout."""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest
from transformers import AutoTokenizer

from tests.server_utils import RemoteServer, assert_openai_error, free_port
from tracevllm.models.loader import resolve_model

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
MAX_MODEL_LEN = 1024
MESSAGES = [{"role": "user", "content": "Hello there!"}]


@pytest.fixture(scope="module")
def server(bundled_model_dir):
    with RemoteServer(["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN)]) as server:
        yield server


@pytest.fixture(scope="module")
def tokenizer(bundled_model_dir):
    return AutoTokenizer.from_pretrained(resolve_model(None))


def post(server, path, body, **kw):
    status, raw = server.request("POST", path, body, **kw)
    return status, json.loads(raw)


def assert_still_serves(server):
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] == 2, body


# ---- /tokenize and /detokenize --------------------------------------------------------------------

def test_tokenize_completion_style(server, tokenizer):
    for add_special in (True, False):
        status, body = post(server, "/tokenize", {"model": MODEL, "prompt": "The capital of France is",
                                                  "add_special_tokens": add_special})
        expected = tokenizer.encode("The capital of France is", add_special_tokens=add_special)
        assert status == 200, body
        assert body == {"count": len(expected), "max_model_len": MAX_MODEL_LEN, "tokens": expected}


def test_tokenize_chat_style_matches_chat_completions_prompt(server, tokenizer):
    status, body = post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True})
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert status == 200 and body["tokens"] == expected and body["count"] == len(expected), body
    status, chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 1})
    assert chat["usage"]["prompt_tokens"] == body["count"]
    status, without = post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert status == 200 and without["count"] < body["count"]


def test_detokenize_round_trip(server, tokenizer):
    ids = tokenizer.encode("Paris is lovely in spring.", add_special_tokens=False)
    status, body = post(server, "/detokenize", {"model": MODEL, "tokens": ids})
    assert status == 200 and body == {"prompt": "Paris is lovely in spring."}


def test_tokenize_errors(server):
    assert_openai_error(post(server, "/tokenize", {"model": "nope", "prompt": "x"}), 404, "model", "does not exist")
    assert_openai_error(post(server, "/tokenize", {"prompt": 3}), 400, "prompt")
    assert_openai_error(post(server, "/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}), 400, "messages")
    assert_openai_error(post(server, "/detokenize", {"tokens": [1, 10**9]}), 400, "tokens", "out of vocabulary")
    assert_openai_error(post(server, "/detokenize", {"tokens": "abc"}), 400, "tokens")
    assert_still_serves(server)


# ---- every bad input in OpenAI's shape -------------------------------------------------------------

GOOD = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}


@pytest.mark.parametrize("raw, status, param, contains", [
    (b'{"model": "x", "prompt": "\xff\xfe"}', 400, None, "not valid UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, 400, None, "nested too deeply"),
    (b"this is not json", 400, None, "not valid JSON"),
    (b'{"prompt": "Hi",', 400, None, "not valid JSON"),
    (b"", 400, None, "body is empty"),
    (json.dumps({**GOOD, "seed": 2**64}).encode(), 400, "seed", "seed"),
    (json.dumps({**GOOD, "seed": -(2**63) - 1}).encode(), 400, "seed", "seed"),
    (json.dumps({**GOOD, "temperature": float("nan")}).encode(), 400, "temperature", "finite"),
    (json.dumps({**GOOD, "temperature": float("inf")}).encode(), 400, "temperature", "finite"),
    (json.dumps({**GOOD, "top_p": float("-inf")}).encode(), 400, "top_p", "finite"),
    (json.dumps({**GOOD, "max_tokens": "2"}).encode(), 400, "max_tokens", "integer"),
    (json.dumps({**GOOD, "prompt": "\ud800"}).encode(), 400, "prompt", "surrogate"),
], ids=["invalid-utf8", "deep-json", "not-json", "truncated-json", "empty", "seed-2**64", "seed-below-int64",
        "temperature-nan", "temperature-inf", "top_p-neg-inf", "wrong-type", "lone-surrogate-prompt"])
def test_bad_completions_body(server, raw, status, param, contains):
    assert_openai_error(post(server, "/v1/completions", raw), status, param, contains)
    assert_still_serves(server)


def test_lone_surrogate_in_chat_message(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi \ud800"}], "max_tokens": 2}
    assert_openai_error(post(server, "/v1/chat/completions", json.dumps(body)), 400, "messages", "surrogate")
    parts = {**body, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}
    assert_openai_error(post(server, "/v1/chat/completions", json.dumps(parts)), 400, "messages", "surrogate")
    assert_still_serves(server)


def test_unknown_route_and_wrong_method(server):
    status, raw = server.request("GET", "/v1/nowhere")
    assert_openai_error((status, json.loads(raw)), 404, None, "not found")
    status, raw = server.request("GET", "/v1/completions")
    assert_openai_error((status, json.loads(raw)), 405, None, "method not allowed")
    assert_still_serves(server)


def test_body_over_limit_is_413(server):
    big = json.dumps({**GOOD, "prompt": "x" * (5 * 1024 * 1024)})
    assert_openai_error(post(server, "/v1/completions", big), 413, None, "--max-request-body-bytes")
    assert_still_serves(server)


def test_chunked_body_over_limit_is_413(server):
    """No Content-Length: the limit is enforced while the body streams in."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    chunks = (b"x" * 65536 for _ in range(100))  # 6.5 MB
    conn.request("POST", "/v1/completions", body=chunks, headers={"Content-Type": "application/json"},
                 encode_chunked=True)
    response = conn.getresponse()
    assert_openai_error((response.status, json.loads(response.read())), 413, None, "larger than")
    conn.close()
    assert_still_serves(server)


# ---- a huge body does not stall other clients -------------------------------------------------------

def _stream_gaps(server, gaps: list[tuple[float, float]], done: threading.Event) -> None:
    """(arrival time, gap since the previous chunk) for each chunk of a long stream."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "stream": True, "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    last = None
    while line := response.fp.readline():
        now = time.perf_counter()
        if line.startswith(b"data:"):
            if last is not None:
                gaps.append((now, now - last))
            last = now
    conn.close()
    done.set()


def test_ten_mb_body_rejected_while_stream_and_health_stay_responsive(server):
    """The stream's chunks keep coming while 10 MB bodies are refused. A chunk gap is also an engine
    step (slow on a busy CPU), so a stall is a gap more than 1 s longer than the stream's median gap."""
    gaps: list[tuple[float, float]] = []
    done = threading.Event()
    streamer = threading.Thread(target=_stream_gaps, args=(server, gaps, done))
    streamer.start()
    while len(gaps) < 3 and not done.is_set():
        time.sleep(0.01)
    health_latencies = []
    huge = json.dumps({**GOOD, "prompt": "word " * (2 * 1024 * 1024)})  # 10 MB
    window_start = time.perf_counter()
    for _ in range(3):
        assert_openai_error(post(server, "/v1/completions", huge), 413, None, "larger than")
        start = time.perf_counter()
        assert server.request("GET", "/health")[0] == 200
        health_latencies.append(time.perf_counter() - start)
    window_end = time.perf_counter()
    streamer.join(300)
    assert done.is_set() and len(gaps) > 10
    median = statistics.median(gap for _, gap in gaps)
    during = [gap for at, gap in gaps if window_start <= at <= window_end + median + 1.0]
    assert during, "no chunk arrived while the huge bodies were sent"
    assert max(during) < median + 1.0, f"the stream stalled: {max(during):.2f} s (median gap {median:.2f} s)"
    assert max(health_latencies) < 1.0, health_latencies


def test_large_tokenize_is_refused_by_its_size(server):
    """A big /tokenize (under the body limit, far over what max_model_len tokens can hold) is a 400
    before the tokenizer spends seconds on it (test_serving_tokenizer_thread shows the tokenizer off
    the event loop, on a model with room for such prompts)."""
    text = "lorem ipsum dolor sit amet " * 130_000  # ~3.5 MB, seconds of tokenizer work on one core
    start = time.perf_counter()
    for body in ({"prompt": text}, {"messages": [{"role": "user", "content": text}]}):
        param = "prompt" if "prompt" in body else "messages"
        assert_openai_error(post(server, "/tokenize", body, timeout=120), 400, param, "bytes")
    assert time.perf_counter() - start < 5.0
    assert_still_serves(server)


# ---- start-up ----------------------------------------------------------------------------------------

def test_startup_lines_and_busy_port(server, bundled_model_dir):
    """A busy port: one line on stderr, no traceback, a non-zero exit code, and no model loaded."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "Traceback" not in proc.stderr, lines


def test_startup_prints_what_it_is_doing(bundled_model_dir, tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--port", str(port), "--dtype", "float32",
         "--max-model-len", "256", "--num-gpu-blocks-override", "40", "--trace-out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Serving" in line:
                break
    finally:
        proc.terminate()
        proc.wait(60)
    text = "".join(lines)
    assert "Loading model" in text
    assert "KV cache: 40 blocks of 16 tokens (624 tokens, block 0 the null block)" in text
    assert f"Traces go to {tmp_path}" in text
    assert f"Serving {MODEL} at http://127.0.0.1:{port}" in text
    order = [text.index(s) for s in ("Loading model", "KV cache", "Traces go to", "Serving")]
    assert order == sorted(order)
