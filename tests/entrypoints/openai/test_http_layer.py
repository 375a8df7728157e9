"""The HTTP layer in process, on a fake engine (no engine core, no sockets): what one client's request
may hold (int64 and float32 bounds, valid Unicode, the server's limits, a prompt's size) is refused
with a 4xx in OpenAI's shape before the tokenizer runs; ``--api-key`` guards every route but
``/health``; a server-side failure is a 500 that tells no traceback; a flood of unknown fields logs
one short line; and the tokenizer's large lane keeps huge inputs away from small ones."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from tests.server_utils import assert_openai_error
from tracevllm.engine.exceptions import EngineDeadError, EngineGenerateError
from tracevllm.entrypoints.openai.api_server import build_app, init_app_state
from tracevllm.entrypoints.openai.serving_engine import OpenAIServing
from tracevllm.entrypoints.openai.tokenizer_lanes import LARGE_INPUT_SIZE, TokenizerLanes
from tracevllm.models.loader import resolve_model

MODEL = "m"
MAX_PROMPT_BYTES = 1000
FAKE_TRACEBACK = 'Traceback (most recent call last):\n  File "core.py", line 1, in step\nRuntimeError: secret'
ROUTES = {
    "/v1/completions": {"prompt": "Hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/tokenize": {"prompt": "Hi"},
    "/detokenize": {"tokens": [1, 2]},
}


class FakeProcessor:
    def check_prompt_bytes(self, text: str) -> None:
        if len(text.encode()) > MAX_PROMPT_BYTES:
            raise ValueError(f"The prompt is {len(text.encode())} bytes, more than can fit.")


class FakeEngine:
    """What the HTTP layer uses of AsyncLLM; ``generate`` raises ``failure`` (after ``tokens_first``)."""

    def __init__(self, tokenizer, failure: BaseException | None = None) -> None:
        self.tokenizer = tokenizer
        self.model_config = SimpleNamespace(max_model_len=1024, vocab_size=len(tokenizer), served_model_name=MODEL,
                                            served_model_names=[MODEL], model="path")
        self.processor = FakeProcessor()
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(block_size=16),
                                           scheduler_config=SimpleNamespace(max_num_seqs=4))
        self.engine_core = SimpleNamespace(num_gpu_blocks=64, max_num_batched_tokens=256)
        self.request_tracer = self.prometheus = None
        self.failure = failure
        self.generated = 0

    async def get_model_config(self):
        return self.model_config

    async def check_health(self) -> None:
        pass

    async def generate(self, *args, **kwargs):
        self.generated += 1
        raise self.failure
        yield  # an async generator, like AsyncLLM.generate


def serve_args(**overrides) -> argparse.Namespace:
    from tracevllm.entrypoints.cli import make_parser

    args = make_parser().parse_args(["serve"])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


@pytest.fixture(scope="module")
def tokenizer(bundled_model_dir):
    return AutoTokenizer.from_pretrained(resolve_model(None))


def make_app(tokenizer, failure: BaseException | None = None, **args):
    app = build_app(serve_args(**args))
    engine = FakeEngine(tokenizer, failure or EngineGenerateError("unused"))
    asyncio.run(init_app_state(engine, app.state, serve_args(**args)))
    return app, engine


async def _call(app, method: str, path: str, body: bytes, headers: list) -> tuple[int, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), *headers],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays: no disconnect

    async def send(message):
        sent.append(message)

    try:
        await app(scope, receive, send)
    except Exception:  # Starlette re-raises what its 500 handler answered, as for uvicorn's log
        pass
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def call(app, method: str, path: str, body: dict | str | None = None, headers: list | None = None) -> tuple[int, bytes]:
    text = body if body is None or isinstance(body, str) else json.dumps(body)
    raw = b"" if text is None else text.encode("utf-8", "surrogatepass")
    return asyncio.run(_call(app, method, path, raw, headers or []))


class CountingLanes(TokenizerLanes):
    def __init__(self) -> None:
        super().__init__()
        self.used = 0

    def submit(self, size: int, call):
        self.used += 1
        return super().submit(size, call)


def count_tokenizer_calls(app) -> CountingLanes:
    lanes = CountingLanes()
    for name in ("openai_serving_chat", "openai_serving_completion", "openai_serving_tokenization"):
        getattr(app.state, name).tokenizer_lanes = lanes
    return lanes


# ---- what a request may hold -------------------------------------------------------------------------

def test_lone_surrogate_model_is_400_on_every_route(tokenizer):
    app, _ = make_app(tokenizer)
    for path, body in ROUTES.items():
        raw = json.dumps({**body, "model": "\ud800"})  # json.dumps writes the escape: "\\ud800"
        assert_openai_error(call(app, "POST", path, raw), 400, "model", "surrogate")


def test_unknown_model_is_404_on_every_route(tokenizer):
    app, _ = make_app(tokenizer)
    for path, body in ROUTES.items():
        error = assert_openai_error(call(app, "POST", path, {**body, "model": "nope"}), 404, "model", "does not exist")
        assert error["code"] == "model_not_found"


@pytest.mark.parametrize("path, field, value", [
    ("/v1/completions", "top_k", 2**64),
    ("/v1/completions", "priority", 2**64),
    ("/v1/completions", "priority", -(2**63) - 1),
    ("/v1/completions", "stop_token_ids", [1, 2**64]),
    ("/v1/completions", "min_tokens", 2**63),
    ("/v1/completions", "max_tokens", 2**64),
    ("/v1/completions", "n", 2**64),
    ("/v1/completions", "logprobs", 2**64),
    ("/v1/completions", "prompt", [1, 2**64]),
    ("/v1/chat/completions", "top_logprobs", 2**64),
    ("/v1/chat/completions", "max_completion_tokens", 2**64),
    ("/detokenize", "tokens", [2**64]),
    ("/v1/completions", "temperature", 1e39),
    ("/v1/completions", "presence_penalty", -1e39),
    ("/v1/chat/completions", "repetition_penalty", 1e39),
])
def test_numbers_beyond_int64_or_float32_are_400(tokenizer, path, field, value):
    app, engine = make_app(tokenizer)
    assert_openai_error(call(app, "POST", path, {**ROUTES[path], field: value}), 400, field)
    assert engine.generated == 0


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("value", [{"a": 1}, 1e308, "Paris", [1], ["ok", None], ["\ud800"], [" "]])
def test_bad_words_of_the_wrong_type_are_400(tokenizer, path, value):
    """vLLM's server takes a list of words; anything else is refused, never ignored."""
    app, engine = make_app(tokenizer)
    assert_openai_error(call(app, "POST", path, {**ROUTES[path], "bad_words": value}), 400, "bad_words")
    assert engine.generated == 0


def test_tools_are_refused_through_chat_template_kwargs_too(tokenizer):
    """The chat template reads ``tools`` from its kwargs as well: the same 400 as the ``tools`` field."""
    app, engine = make_app(tokenizer)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    chat = ROUTES["/v1/chat/completions"]
    by_field = call(app, "POST", "/v1/chat/completions", {**chat, "tools": tools})
    by_kwargs = call(app, "POST", "/v1/chat/completions", {**chat, "chat_template_kwargs": {"tools": tools}})
    assert_openai_error(by_field, 400, "tools", "not supported")
    assert by_kwargs == by_field and engine.generated == 0


@pytest.mark.parametrize("field, value", [
    ("stop", 5), ("stop", {"a": 1}), ("stop", "\ud800"), ("stop_token_ids", 5), ("ignore_eos", "x"),
    ("prompt", "\ud800"),
])
def test_what_sampling_params_refuses_offline_is_a_400_here(tokenizer, field, value):
    """The values issue 48 found SamplingParams taking (or failing on) offline: 400s naming the field."""
    app, engine = make_app(tokenizer)
    assert_openai_error(call(app, "POST", "/v1/completions", {**ROUTES["/v1/completions"], field: value}), 400,
                        field)
    assert engine.generated == 0


@pytest.mark.parametrize("body, param, contains", [
    ({"n": 129}, "n", "--max-n"),
    ({"prompt": ["Hi"] * 129}, "prompt", "--max-prompts"),
    ({"stop": ["x"] * 65}, "stop", "--max-stop-strings"),
    ({"stop": "x" * (16 * 1024 + 1)}, "stop", "--max-stop-chars"),
    ({"stop_token_ids": list(range(1025))}, "stop_token_ids", "--max-stop-token-ids"),
    ({"bad_words": ["x"] * 65}, "bad_words", "--max-stop-strings"),
    ({"bad_words": ["x" * (16 * 1024 + 1)]}, "bad_words", "--max-stop-chars"),
    ({"prompt": "x" * (MAX_PROMPT_BYTES + 1)}, "prompt", "bytes"),
    ({"prompt": ["Hi", "é" * (MAX_PROMPT_BYTES // 2 + 1)]}, "prompt", "bytes"),
])
def test_limits_refused_before_the_tokenizer_runs(tokenizer, body, param, contains):
    app, engine = make_app(tokenizer)
    lanes = count_tokenizer_calls(app)
    assert_openai_error(call(app, "POST", "/v1/completions", {**ROUTES["/v1/completions"], **body}), 400, param,
                        contains)
    assert lanes.used == 0 and engine.generated == 0


def test_limits_follow_the_serve_flags(tokenizer):
    app, _ = make_app(tokenizer, max_n=2, max_stop_strings=1)
    assert_openai_error(call(app, "POST", "/v1/completions", {**ROUTES["/v1/completions"], "n": 3}), 400, "n",
                        "at most 2")
    assert_openai_error(call(app, "POST", "/v1/chat/completions", {**ROUTES["/v1/chat/completions"],
                                                                   "stop": ["a", "b"]}), 400, "stop", "at most 1")


def test_messages_bytes_counted_together_before_the_template(tokenizer):
    """Each message is under the bound, their total is not: refused before the chat template runs."""
    app, _ = make_app(tokenizer)
    lanes = count_tokenizer_calls(app)
    half = "y" * (MAX_PROMPT_BYTES // 2 + 1)
    messages = [{"role": "user", "content": half}, {"role": "assistant", "content": half}]
    assert_openai_error(call(app, "POST", "/v1/chat/completions", {"messages": messages}), 400, "messages", "bytes")
    assert_openai_error(call(app, "POST", "/tokenize", {"messages": messages}), 400, "messages", "bytes")
    assert_openai_error(call(app, "POST", "/tokenize", {"prompt": half * 2}), 400, "prompt", "bytes")
    assert lanes.used == 0


# ---- --api-key and --disable-fastapi-docs -----------------------------------------------------------

def test_api_key_guards_every_route_but_health_and_the_page(tokenizer):
    app, _ = make_app(tokenizer, api_key="sesame")
    for method, path in [("GET", "/version"), ("GET", "/metrics"), ("GET", "/v1/models"), ("GET", "/docs"),
                         ("GET", "/redoc"), ("GET", "/openapi.json"), ("POST", "/tokenize"),
                         ("POST", "/detokenize"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/engine/events"), ("GET", "/nowhere"), ("OPTIONS", "/v1/models")]:
        body = ROUTES.get(path) if method == "POST" else None
        error = assert_openai_error(call(app, method, path, body), 401, None, "api key")
        assert error["code"] == "invalid_api_key"
        wrong = [(b"authorization", b"Bearer wrong")]
        assert call(app, method, path, body, wrong)[0] == 401
    assert call(app, "GET", "/health")[0] == 200
    # The live page and its scripts hold no data (a browser cannot send the key to open a page); the
    # event stream it reads is guarded above.
    for path in ("/ui", "/ui/palette.css", "/ui/palette.js", "/ui/static/main.js", "/ui/static/style.css"):
        assert call(app, "GET", path)[0] == 200, path
    key = [(b"authorization", b"Bearer sesame")]
    assert call(app, "GET", "/version", headers=key)[0] == 200
    assert call(app, "POST", "/tokenize", ROUTES["/tokenize"], headers=key)[0] == 200


def test_an_authorization_header_that_is_not_utf8_is_a_401(tokenizer):
    """The header's bytes are compared as bytes: 0xff is a wrong key, not a decoding error (a 500)."""
    app, _ = make_app(tokenizer, api_key="sesame")
    for value in (b"Bearer \xff", b"\xff\xfe", b"Bearer sesame\xff"):
        error = assert_openai_error(call(app, "GET", "/v1/models", headers=[(b"authorization", value)]), 401, None,
                                    "api key")
        assert error["code"] == "invalid_api_key"


def test_health_answers_head_for_load_balancers(tokenizer):
    app, _ = make_app(tokenizer, api_key="sesame")
    assert call(app, "HEAD", "/health") == (200, b"")
    assert call(app, "GET", "/health") == (200, b"")


def test_disable_fastapi_docs(tokenizer):
    app, _ = make_app(tokenizer)
    assert [call(app, "GET", path)[0] for path in ("/docs", "/redoc", "/openapi.json")] == [200, 200, 200]
    app, _ = make_app(tokenizer, disable_fastapi_docs=True)
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert_openai_error(call(app, "GET", path), 404, None, "not found")


# ---- a failure on the server's side tells no traceback -------------------------------------------------

@pytest.mark.parametrize("failure, contains", [
    (EngineDeadError(FAKE_TRACEBACK), "engine core died"),
    (EngineGenerateError(f"Request cmpl-1 failed: {RuntimeError('secret')!r}"), "engine failed this request"),
])
def test_engine_failures_are_500s_without_the_traceback(tokenizer, caplog, failure, contains):
    app, _ = make_app(tokenizer, failure=failure)
    with caplog.at_level(logging.ERROR, logger="tracevllm"):
        for path in ("/v1/completions", "/v1/chat/completions"):
            status, raw = call(app, "POST", path, ROUTES[path])
            assert_openai_error((status, raw), 500, None, contains)
            assert b"secret" not in raw and b"Traceback" not in raw
            status, raw = call(app, "POST", path, {**ROUTES[path], "stream": True})
            events = [line.removeprefix(b"data: ") for line in raw.splitlines() if line.startswith(b"data: ")]
            assert status == 200 and events[-1] == b"[DONE]", raw
            error = json.loads(events[-2])["error"]
            assert error["type"] == "server_error" and contains in error["message"], error
            assert b"secret" not in raw and b"Traceback" not in raw
    if isinstance(failure, EngineGenerateError):  # an EngineDeadError was logged once, by AsyncLLM's output handler
        assert "secret" in caplog.text


def test_unexpected_error_is_a_500_without_its_text(tokenizer, caplog, monkeypatch):
    app, _ = make_app(tokenizer)

    async def bug(request):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(app.state.openai_serving_tokenization, "create_tokenize", bug)
    with caplog.at_level(logging.ERROR, logger="tracevllm"):
        status, raw = call(app, "POST", "/tokenize", ROUTES["/tokenize"])
    assert_openai_error((status, raw), 500, None, "internal server error")
    assert b"secret" not in raw and b"RuntimeError" not in raw
    assert "secret internals" in caplog.text


# ---- the log line for ignored fields ---------------------------------------------------------------------

def test_ignored_fields_log_line_is_short(tokenizer, caplog):
    app, _ = make_app(tokenizer)
    body = {**ROUTES["/v1/completions"], **{f"field_{i:06d}": 0 for i in range(100_000)}, "a" * 10_000: 0}
    with caplog.at_level(logging.WARNING, logger="tracevllm"):
        call(app, "POST", "/v1/completions", body)
    [line] = [r.getMessage() for r in caplog.records if "Ignored fields" in r.getMessage()]
    assert len(line) < 1000 and "field_000000" in line and "... and 99991 more" in line and "a" * 41 not in line, line


# ---- the tokenizer's lanes ---------------------------------------------------------------------------------

def test_huge_inputs_do_not_hold_up_small_ones(tokenizer):
    """Four huge inputs keep the large lane busy; a small one goes to the small lane and is not queued behind."""
    serving = OpenAIServing(FakeEngine(tokenizer), models=None)  # type: ignore[arg-type]

    async def run() -> float:
        huge = [asyncio.ensure_future(serving.run_tokenizer(LARGE_INPUT_SIZE + 1, time.sleep, 0.5)) for _ in range(4)]
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        assert await serving.run_tokenizer(5, tokenizer.encode, "Hello") == tokenizer.encode("Hello")
        small = time.perf_counter() - start
        assert not all(task.done() for task in huge)
        await asyncio.gather(*huge)
        return small

    assert asyncio.run(run()) < 0.2
    lane = [serving.tokenizer_lanes.submit(size, lambda: threading.current_thread().name).result()
            for size in (LARGE_INPUT_SIZE, LARGE_INPUT_SIZE + 1)]
    assert lane[0].startswith("tokenizer_") and lane[1].startswith("tokenizer-large_"), lane
