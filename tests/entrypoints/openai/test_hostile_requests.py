"""One client cannot take the server down: every request that once killed the engine core, hung the
event loop or got a 500 is answered 4xx in OpenAI's shape within a second, ``/health`` stays fast, and
the next good request is served by the same engine-core process. Then a seeded fuzz of mutated valid
bodies: no 5xx, no engine death, every response in OpenAI's shape. Real HTTP throughout, on a tiny
random-weight Llama (so the requests that pass validation generate quickly)."""

from __future__ import annotations

import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.server_utils import RemoteServer

pytestmark = pytest.mark.slow

MODEL = "tiny"
MAX_MODEL_LEN = 256
FUZZ_REQUESTS = 2000
FUZZ_SECONDS = 600  # a bound, never reached on a quiet machine: the fuzz stops there whatever its count


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    with RemoteServer([tiny_checkpoint("llama"), "--served-model-name", MODEL, "--dtype", "float32",
                       "--max-model-len", str(MAX_MODEL_LEN), "--uvicorn-log-level", "warning"]) as server:
        yield server


def assert_openai_error_shape(body: bytes) -> dict:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert "Traceback" not in error["message"], error
    return error


def assert_healthy(server, engine_pid: int) -> None:
    started = time.perf_counter()
    status, _ = server.request("GET", "/health", timeout=5)
    assert status == 200 and time.perf_counter() - started < 1.0
    assert server.engine_core_process().pid == engine_pid
    status, body = server.request("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2, body


HOSTILE = {
    # (route, body, the status it must get)
    "top_k past int64": ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "temperature": 1,
                                             "top_k": 9223372036854775808}, 400),
    "top_k past the vocabulary": ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "temperature": 1,
                                                      "top_k": 10**9}, 400),
    "temperature past float32": ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 1e39,
                                                     "min_tokens": 2}, 400),
    "repetition_penalty underflows float32": ("/v1/completions", {"prompt": "hi hi hi", "max_tokens": 4,
                                                                  "temperature": 1.0,
                                                                  "repetition_penalty": 1e-45}, 400),
    "n = 2**62": ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 2**62}, 400),
    "n = 10**6": ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 10**6}, 400),
    "n = 100000 (chat)": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 1, "n": 100000}, 400),
    "1,000 prompts": ("/v1/completions", {"prompt": ["hi"] * 1000, "max_tokens": 1}, 400),
    "10,000 stop strings": ("/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                                "stop": [f"s{i}" for i in range(10000)]}, 400),
    "a 1 MB stop string": ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "stop": "x" * 2**20}, 400),
    "100,000 stop_token_ids": ("/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                                   "stop_token_ids": list(range(100000))}, 400),
    "top_k = 2**64": ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "top_k": 2**64}, 400),
    "priority = 2**64": ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "priority": 2**64}, 400),
    "stop_token_ids of 2**64": ("/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                                    "stop_token_ids": [2**64]}, 400),
    "a lone surrogate model (completions)": ("/v1/completions", {"model": "\ud800", "prompt": "hi"}, 400),
    "a lone surrogate model (chat)": ("/v1/chat/completions", {"model": "\ud800", "messages": [
        {"role": "user", "content": "hi"}]}, 400),
    "a lone surrogate model (tokenize)": ("/tokenize", {"model": "\ud800", "prompt": "hi"}, 400),
    "a lone surrogate model (detokenize)": ("/detokenize", {"model": "\ud800", "tokens": [1, 2]}, 400),
    "an unknown model": ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404),
    "a 4 MB prompt": ("/v1/completions", {"prompt": "word " * 800_000, "max_tokens": 1}, 400),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_request_is_refused_and_the_engine_goes_on(server, name):
    route, body, expected = HOSTILE[name]
    engine_pid = server.engine_core_process().pid
    payload = {"model": MODEL, **body}
    started = time.perf_counter()
    status, raw = server.request("POST", route, json.dumps(payload), timeout=30)
    elapsed = time.perf_counter() - started
    assert status == expected, raw[:500]
    error = assert_openai_error_shape(raw)
    if expected == 404:
        assert error["code"] == "model_not_found"
    if "surrogate" in name:  # not valid Unicode, so no model's name: the field is refused as such
        assert error["param"] == "model"
    assert elapsed < 1.0, f"{name}: answered in {elapsed:.2f} s"
    assert_healthy(server, engine_pid)


def test_a_max_seed_with_n_samples_is_served(server):
    """Children's seeds are seed + i wrapped into int64: the client's own seed is all it has to be valid."""
    engine_pid = server.engine_core_process().pid
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "n": 3, "temperature": 1.0, "seed": 2**63 - 1}
    status, raw = server.request("POST", "/v1/completions", body)
    assert status == 200, raw
    again = server.request("POST", "/v1/completions", body)
    assert json.loads(raw)["choices"] == json.loads(again[1])["choices"]  # seeded: reproducible
    assert_healthy(server, engine_pid)


# ---- the fuzz ------------------------------------------------------------------------------------

VALID = [
    ("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 3, 4], "max_tokens": 3, "temperature": 0.8,
                         "top_p": 0.9, "top_k": 20, "seed": 7, "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2, "n": 2, "logprobs": 2,
                         "echo": True}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
                              "max_tokens": 4}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."},
                                                           {"role": "user", "content": "Hi"}],
                              "max_completion_tokens": 3, "stream": True, "logprobs": True, "top_logprobs": 2,
                              "stream_options": {"include_usage": True}, "temperature": 1.2, "min_p": 0.05,
                              "repetition_penalty": 1.1, "stop": ["\n"], "min_tokens": 1}),
    ("/tokenize", {"model": MODEL, "prompt": "Hello world"}),
    ("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}),
    ("/detokenize", {"model": MODEL, "tokens": [1, 2, 3]}),
]

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p",
          "top_k", "min_p", "seed", "stop", "stop_token_ids", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "min_tokens", "logprobs", "top_logprobs", "prompt_logprobs", "echo", "stream",
          "stream_options", "priority", "ignore_eos", "tokens", "best_of", "logit_bias", "response_format",
          "add_special_tokens", "skip_special_tokens", "include_stop_str_in_output", "chat_template_kwargs",
          "truncate_prompt_tokens", "bad_words", "user", "suffix", "tools", "no_such_field"]

HOSTILE_VALUES = [
    None, True, False, 0, -1, 1, 2, 255, 10**6, 2**31, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63) - 1,
    10**30, -(10**30), 0.0, -0.0, 1e-45, -1e-45, 1e-5, 0.5, 1.5, 3.0, 1e38, 1e39, -1e39, 1e308,
    float("nan"), float("inf"), float("-inf"),
    "", " ", "hi", "\ud800", "\udfff x", "\x00", "\u202e\u2066", "🙂" * 50, "x" * 100_000, "<|im_start|>",
    [], [None], [""], [0], [-1], [2**64], [49152], [1.5], ["a"] * 300, [[1, 2], [3]], [[]], list(range(2000)),
    {}, {"a": 1}, {"include_usage": "yes"}, {"role": "user"}, [{"role": "user", "content": "\ud800"}],
    [{"role": "wizard", "content": "x"}], [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    [{"role": "user", "content": [{"type": "image_url"}]}], {"type": "json_object"},
]


def mutate(rng: random.Random, body: dict):
    """A valid body with one to three fields set to hostile values (or removed); now and then the raw
    bytes themselves are broken instead."""
    body = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        field = rng.choice(FIELDS)
        if rng.random() < 0.1:
            body.pop(field, None)
        else:
            body[field] = rng.choice(HOSTILE_VALUES)
    text = json.dumps(body)  # allow_nan: NaN and Infinity go out as Python's json writes them
    kind = rng.random()
    if kind < 0.03:
        return text[: rng.randint(0, len(text))].encode("utf-8", "surrogatepass")  # truncated JSON
    if kind < 0.05:
        return text.encode("utf-8", "surrogatepass") + b"\xff\xfe"  # not UTF-8
    if kind < 0.06:
        return ("[" * 5000 + "]" * 5000).encode()  # nested deep
    return text.encode("utf-8", "surrogatepass")


def check_response(status: int, raw: bytes, stream: bool) -> str | None:
    """None if the response is one a well-behaved OpenAI server could send, else what is wrong."""
    if status >= 500:
        return f"HTTP {status}: {raw[:300]!r}"
    if status != 200:
        try:
            assert_openai_error_shape(raw)
        except (AssertionError, ValueError, KeyError, TypeError) as e:
            return f"HTTP {status} not in OpenAI's shape ({e!r}): {raw[:300]!r}"
        return None
    if not stream or not raw.startswith(b"data:"):
        try:
            json.loads(raw)
        except ValueError:
            return f"a 200 that is not JSON: {raw[:300]!r}"
        return None
    events = [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]
    if not events or events[-1] != b"[DONE]":
        return f"a stream without [DONE]: {raw[-300:]!r}"
    for event in events[:-1]:
        chunk = json.loads(event)
        if "error" in chunk:
            error = chunk["error"]
            if error.get("type") == "server_error" or (error.get("code") or 0) == 500:
                return f"a 500 in the stream: {event[:300]!r}"
    return None


def test_fuzz_mutated_bodies(server):
    engine_pid = server.engine_core_process().pid
    rng = random.Random(27)
    cases = []
    for _ in range(FUZZ_REQUESTS):
        route, body = rng.choice(VALID)
        cases.append((route, mutate(rng, body)))
    deadline = time.time() + FUZZ_SECONDS
    problems: list[str] = []
    statuses: dict[int, int] = {}

    def send(case) -> None:
        route, raw_body = case
        if time.time() > deadline:
            return
        status, raw = server.request("POST", route, raw_body, timeout=60)
        statuses[status] = statuses.get(status, 0) + 1
        stream = b'"stream": true' in raw_body
        problem = check_response(status, raw, stream)
        if problem:
            problems.append(f"{route} {raw_body[:200]!r}: {problem}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, cases))
    assert not problems, f"{len(problems)} bad responses, e.g.:\n" + "\n".join(problems[:5])
    assert sum(statuses.values()) >= FUZZ_REQUESTS, f"only {sum(statuses.values())} requests within the bound"
    assert statuses.get(200, 0) > 100 and sum(n for s, n in statuses.items() if 400 <= s < 500) > 500, statuses
    assert_healthy(server, engine_pid)
    assert_engine_empty(server)


def assert_engine_empty(server, within: float = 5.0) -> None:
    """Every request has left the engine core: no lost or leaked request, no KV block still held
    (the prefix cache keeps blocks, but as free ones: usage counts held blocks only)."""
    deadline = time.time() + within
    while True:
        metrics = server.metrics()
        held = (metrics["vllm:num_requests_running"], metrics["vllm:num_requests_waiting"],
                metrics["vllm:kv_cache_usage_perc"])
        if held == (0, 0, 0) or time.time() > deadline:
            break
        time.sleep(0.2)
    assert held == (0, 0, 0), held


# ---- a huge fan-out whose client leaves ------------------------------------------------------------

@pytest.fixture(scope="module")
def wide_server(tiny_checkpoint):
    """A server that lets a request fan out to 100,000 samples (the default cap is OpenAI's 128)."""
    with RemoteServer([tiny_checkpoint("llama"), "--served-model-name", MODEL, "--dtype", "float32",
                       "--max-model-len", str(MAX_MODEL_LEN), "--max-n", "100000",
                       "--uvicorn-log-level", "warning"]) as server:
        yield server


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_mid_fan_out_leaves_nothing_in_the_engine(wide_server, stream):
    engine_pid = wide_server.engine_core_process().pid
    # A first wide batch compiles the model's step for its shapes (seconds on a small CPU): done here,
    # so that the engine is stepping while the client below is there.
    warm = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "n": 512}
    assert wide_server.request("POST", "/v1/completions", warm, timeout=300)[0] == 200
    # Each sample makes one token and leaves the engine in the step that made it, so the running and
    # waiting gauges may read 0 at any moment: the token counter shows the fan-out under way instead.
    generated_before = wide_server.metrics()["vllm:generation_tokens_total"]
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1, "n": 100000, "stream": stream})
    conn = socket.create_connection(("127.0.0.1", wide_server.port))
    conn.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    slowest_health, generated = 0.0, 0.0
    sent_at = time.time()
    # The children are being sent: the server keeps answering. At least 3 s, and until some have run.
    while time.time() < sent_at + 3 or (generated == 0 and time.time() < sent_at + 60):
        started = time.perf_counter()
        assert wide_server.request("GET", "/health", timeout=5)[0] == 200
        slowest_health = max(slowest_health, time.perf_counter() - started)
        time.sleep(0.2)
        generated = wide_server.metrics()["vllm:generation_tokens_total"] - generated_before
    conn.close()  # the client leaves
    assert generated > 0
    assert slowest_health < 1.0, slowest_health
    assert_engine_empty(wide_server, within=5.0)
    generated = wide_server.metrics()["vllm:generation_tokens_total"] - generated_before
    assert generated < 100000, "the samples not yet run when the client left were run anyway"
    assert_healthy(wide_server, engine_pid)
