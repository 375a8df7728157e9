"""vLLM's ``prompt_logprobs`` over HTTP, and ``echo`` with ``logprobs`` (which needs them), checked
against the offline engine on the same tiny checkpoint; the streaming refusal in OpenAI's shape."""

from __future__ import annotations

import json

import pytest

from tests.server_utils import RemoteServer
from tracevllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model_dir(tiny_checkpoint):
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def server(model_dir):
    with RemoteServer(["--model", model_dir, "--served-model-name", "tiny", "--dtype", "float32",
                       "--disable-log-stats"]) as server:
        yield server


def post(server, path: str, body: dict) -> tuple[int, dict]:
    status, raw = server.request("POST", path, body)
    return status, json.loads(raw)


@pytest.fixture(scope="module")
def offline(model_dir):
    return LLM(model_dir, dtype="float32").generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=4, logprobs=2, prompt_logprobs=2), use_tqdm=False)[0]


def test_completion_prompt_logprobs_match_the_engine(server, offline):
    status, body = post(server, "/v1/completions", {
        "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 2})
    assert status == 200, body
    (choice,) = body["choices"]
    served = choice["prompt_logprobs"]
    assert served[0] is None and len(served) == len(offline.prompt_token_ids)
    for position, expected in zip(served[1:], offline.prompt_logprobs[1:]):
        assert {int(t): (v["rank"], v["decoded_token"]) for t, v in position.items()} == \
            {t: (lp.rank, lp.decoded_token) for t, lp in expected.items()}
        for t, lp in expected.items():
            assert position[str(t)]["logprob"] == pytest.approx(lp.logprob, abs=1e-4)


def test_echo_with_logprobs_covers_the_prompt_then_the_output(server, offline):
    status, body = post(server, "/v1/completions", {
        "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2})
    assert status == 200, body
    (choice,) = body["choices"]
    logprobs = choice["logprobs"]
    num_prompt, num_output = len(offline.prompt_token_ids), len(offline.outputs[0].token_ids)
    assert len(logprobs["tokens"]) == num_prompt + num_output
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = [p[t].logprob for p, t in zip(offline.prompt_logprobs[1:], offline.prompt_token_ids[1:])]
    expected += [p[t].logprob for p, t in zip(offline.outputs[0].logprobs, offline.outputs[0].token_ids)]
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    assert choice["text"].startswith(PROMPT) and logprobs["text_offset"][num_prompt] == len(PROMPT)


def test_chat_prompt_logprobs_and_the_streaming_refusal(server):
    messages = [{"role": "user", "content": "Hi"}]
    status, body = post(server, "/v1/chat/completions", {
        "model": "tiny", "messages": messages, "max_tokens": 2, "prompt_logprobs": 1})
    assert status == 200, body
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"]
    for path, extra in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": messages})):
        status, body = post(server, path, {"model": "tiny", "stream": True, "prompt_logprobs": 1, **extra})
        assert status == 400 and body["error"]["param"] == "prompt_logprobs", body
        assert "stream" in body["error"]["message"]
    status, body = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "prompt_logprobs": 21})
    assert status == 400 and body["error"]["param"] == "prompt_logprobs"
    assert post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 2})[0] == 200
