"""The server's tokenizer threads (serving_engine.TokenizerLanes): a 10 MB prompt is tokenized off the
event loop, so /health and other clients' streams go on while it is refused; four 4 MB prompts take
the large lane, so a small request is not queued behind them; and chat-style /tokenize honours
``add_special_tokens`` as vLLM does. Real HTTP, on a tiny llama whose tokenizer adds a BOS (the bundled
SmolLM2's adds none, so ``add_special_tokens`` would change nothing there), with a context window of
256Ki tokens: a 10 MB prompt is then under the byte bound (Processor.check_prompt_bytes), so the
tokenizer runs on it before it is found too long."""

from __future__ import annotations

import http.client
import json
import shutil
import statistics
import threading
import time

import pytest
from transformers import AutoTokenizer

from tests.server_utils import RemoteServer

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 256 * 1024
BODY_LIMIT = 16 * 1024 * 1024  # above the 10 MB body, so that it reaches the tokenizer (the default 4 MiB is a 413)
MESSAGES = [{"role": "user", "content": "Say hello in French."}]


@pytest.fixture(scope="module")
def bos_model_dir(tiny_checkpoint, tmp_path_factory) -> str:
    model_dir = shutil.copytree(tiny_checkpoint("llama", max_position_embeddings=MAX_MODEL_LEN),
                                tmp_path_factory.mktemp("tok") / "llama-bos")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, add_bos_token=True)
    tokenizer.save_pretrained(model_dir)
    return str(model_dir)


@pytest.fixture(scope="module")
def tokenizer(bos_model_dir):
    return AutoTokenizer.from_pretrained(bos_model_dir, local_files_only=True)


@pytest.fixture(scope="module")
def server(bos_model_dir):
    args = ["--model", bos_model_dir, "--served-model-name", "tiny", "--dtype", "float32",
            "--max-model-len", str(MAX_MODEL_LEN), "--max-request-body-bytes", str(BODY_LIMIT), "--disable-log-stats"]
    with RemoteServer(args) as server:
        yield server


def post(server, path, body, **kw):
    status, raw = server.request("POST", path, json.dumps(body), **kw)
    return status, json.loads(raw)


# ---- add_special_tokens -------------------------------------------------------------------------

def test_chat_tokenize_honours_add_special_tokens(server, tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    rendered = tokenizer.encode(text, add_special_tokens=False)
    assert rendered[0] == tokenizer.bos_token_id  # the template writes its own BOS
    status, default = post(server, "/tokenize", {"messages": MESSAGES})
    assert status == 200 and default["tokens"] == rendered, default
    status, added = post(server, "/tokenize", {"messages": MESSAGES, "add_special_tokens": True})
    assert status == 200 and added["tokens"] == [tokenizer.bos_token_id] + rendered, added
    status, off = post(server, "/tokenize", {"messages": MESSAGES, "add_special_tokens": False})
    assert status == 200 and off == default
    # completion-style keeps its own default (True), as in vLLM
    status, plain = post(server, "/tokenize", {"prompt": "Hi"})
    assert status == 200 and plain["tokens"] == tokenizer.encode("Hi") and plain["tokens"][0] == tokenizer.bos_token_id
    # /v1/chat/completions reads the same field the same way: its prompt is what /tokenize counted
    for body, expected in (({}, default), ({"add_special_tokens": True}, added)):
        status, chat = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, **body})
        assert status == 200 and chat["usage"]["prompt_tokens"] == expected["count"], chat


# ---- a 10 MB prompt does not stall anyone else ----------------------------------------------------

def _stream_chunks(server, arrivals: list[float], stop: threading.Event) -> None:
    """Streams one completion after another until ``stop``, noting when each SSE line arrives (so the
    stream covers however long the huge requests take on a busy machine)."""
    body = {"prompt": "Once upon a time", "max_tokens": 100, "stream": True, "ignore_eos": True}
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise AssertionError(f"the stream got {response.status}: {response.read()!r}")
        while line := response.fp.readline():  # raw SSE lines (the chunk framing is read around them)
            if line.startswith(b"data:"):
                arrivals.append(time.perf_counter())
            if line.startswith(b"data: [DONE]"):
                break  # the connection stays open (keep-alive): reading on would wait for its timeout
        conn.close()


def _poll_health(server, latencies: list[tuple[float, float]], stop: threading.Event) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        status = server.request("GET", "/health", timeout=120)[0]
        latencies.append((start, time.perf_counter() - start if status == 200 else float("inf")))
        time.sleep(0.05)


class Worker(threading.Thread):
    """A thread whose exception the test sees (``join`` re-raises it)."""

    def __init__(self, target, *args) -> None:
        super().__init__(target=target, args=args, daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as e:
            self.error = e

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


def test_ten_mb_prompt_is_refused_while_stream_and_health_stay_responsive(server):
    """Each huge prompt takes the tokenizer seconds before it is found longer than max_model_len (a
    400); meanwhile the other client's chunks keep coming, its new streams start, and /health
    answers, each within 1 s. (Tokenized on the event loop, everything stopped for those seconds; with
    a single tokenizer thread, each new stream waited behind the huge prompt.) The tiny model keeps
    this about the event loop: the bundled model's forward pass, two OpenMP threads, shares a 2-core
    machine with the tokenizer thread and slows about 10x while it runs (CPU, not the loop)."""
    arrivals: list[float] = []
    health: list[tuple[float, float]] = []
    stop = threading.Event()
    streamer = Worker(_stream_chunks, server, arrivals, stop)
    streamer.start()
    while len(arrivals) < 3 and streamer.is_alive():
        time.sleep(0.01)
    poller = Worker(_poll_health, server, health, stop)
    poller.start()
    huge = "word " * (2 * 1024 * 1024)  # 10 MB, 2 million tokens
    window_start = time.perf_counter()
    try:
        for path, body in (("/v1/completions", {"prompt": huge}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]})):
            status, error = post(server, path, {**body, "max_tokens": 2}, timeout=300)
            assert status == 400, error
            assert set(error["error"]) == {"message", "type", "param", "code"}
            assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["error"]["message"], error
            assert error["error"]["param"] == ("prompt" if path == "/v1/completions" else "messages")
    finally:
        window_end = time.perf_counter()
        time.sleep(0.5)  # the stream and the polls go on past the window's end
        stop.set()
        streamer.join(300)
        poller.join(300)
    assert window_end - window_start > 1.0, "too fast to show anything: the tokenizer did not run on these"
    assert arrivals[0] < window_start and arrivals[-1] > window_end, "the stream did not cover the window"
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if b >= window_start and a <= window_end]
    assert max(gaps) < 1.0, f"the stream stalled for {max(gaps):.2f} s"
    during = [latency for start, latency in health if window_start <= start <= window_end]
    assert len(during) > 5 and max(during) < 1.0, during
    status, body = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] == 2, body


def small_request_latency(server) -> float:
    start = time.perf_counter()
    status, body = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 200, body
    return time.perf_counter() - start


def test_four_huge_prompts_do_not_hold_up_a_small_one(server):
    """Four concurrent 4 MB prompts, each tokenized (seconds) before it is found too long: they queue
    in the tokenizer's large lane, and a small request, in the small lane, is answered within 1 s of
    its time on an idle server. (With one pool of four threads, the four held all of it and every
    other request waited for them.)"""
    baseline = statistics.median(small_request_latency(server) for _ in range(3))
    answers: list[int] = []
    huge = [Worker(lambda: answers.append(post(server, "/v1/completions", {"prompt": "word " * (800 * 1024)},
                                               timeout=300)[0])) for _ in range(4)]
    start = time.perf_counter()
    for worker in huge:
        worker.start()
    latencies = []
    while any(worker.is_alive() for worker in huge):
        latencies.append(small_request_latency(server))
        time.sleep(0.05)
    for worker in huge:
        worker.join()
    assert answers == [400] * 4
    assert time.perf_counter() - start > 2.0, "too fast to show anything: the tokenizer did not run on these"
    assert len(latencies) > 3 and max(latencies) < baseline + 1.0, (baseline, latencies)
