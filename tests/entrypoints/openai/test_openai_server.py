"""``tracevllm serve`` on the bundled model, checked with the official ``openai`` client."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from typing import get_args

import openai
import pytest

from tests.server_utils import RemoteServer
from tracevllm import LLM, SamplingParams
from tracevllm.core.events import WaitingReason

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
API_KEY = "test-key"
MAX_MODEL_LEN = 1024
MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def server(bundled_model_dir):
    with RemoteServer(["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN)], api_key=API_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def llm(bundled_model_dir):
    return LLM(dtype="float32", max_model_len=MAX_MODEL_LEN)


def wait_until_idle(server: RemoteServer, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.time() + timeout
    while True:
        m = server.metrics()
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0 or time.time() > deadline:
            return m
        time.sleep(0.2)


def test_health_version_models(server, client):
    assert server.request("GET", "/health")[0] == 200
    status, body = server.request("GET", "/version")
    assert status == 200 and json.loads(body)["version"]
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_greedy_chat_equals_llm_chat(client, llm):
    expected = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0].outputs[0]
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=32)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert response.usage.completion_tokens == len(expected.token_ids)
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_chat_stream_equals_chat(client):
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == full.choices[0].message.content
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage


def test_completion_n2_logprobs_and_usage(client):
    response = client.completions.create(model=MODEL, prompt="Once upon a time", n=2, temperature=1.0, seed=3,
                                         max_tokens=12, logprobs=2)
    assert sorted(c.index for c in response.choices) == [0, 1]
    num_tokens = 0
    for choice in response.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        assert "".join(lp.tokens) == choice.text  # offsets and tokens cover the text exactly
        assert all(v <= 0 for v in lp.token_logprobs)
        assert all(2 <= len(top) <= 3 for top in lp.top_logprobs)  # the top 2, plus the sampled one
        num_tokens += len(lp.tokens)
    assert response.usage.completion_tokens == num_tokens
    assert response.usage.prompt_tokens == 4
    again = client.completions.create(model=MODEL, prompt="Once upon a time", n=2, temperature=1.0, seed=3,
                                      max_tokens=12)
    assert [c.text for c in again.choices] == [c.text for c in response.choices]  # seeded


def test_chat_logprobs(client):
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8,
                                              logprobs=True, top_logprobs=3)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    # The EOS token that ended the reply has a logprob too, but no text in the message.
    assert "".join(c.token for c in content).removesuffix("<|im_end|>") == response.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token is the most likely
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert bytes(entry.bytes).decode() == entry.token


def test_stop_strings_streamed_and_not(client):
    prompt = "1, 2, 3, 4, 5,"
    plain = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16)
    assert " 7," in plain.choices[0].text
    response = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16, stop=[" 7,"])
    choice = response.choices[0]
    assert choice.text == plain.choices[0].text.split(" 7,")[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == " 7,"
    # Streaming must not leak the start of the stop string before it is recognised.
    stream = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16, stop=[" 7,"],
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == choice.text


def test_bad_words_are_applied(client, llm):
    """As LLM.generate applies them: the banned word never appears, streamed or not."""
    prompt = "The capital of France is"
    plain = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12)
    assert "Paris" in plain.choices[0].text  # so that banning it changes something
    banned = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12,
                                       extra_body={"bad_words": ["Paris"]})
    text = banned.choices[0].text
    expected = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, bad_words=["Paris"]),
                            use_tqdm=False)[0].outputs[0].text
    assert "Paris" not in text and text == expected
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=32,
                                          extra_body={"bad_words": ["Paris"]}, stream=True)
    assert "Paris" not in "".join(c.choices[0].delta.content or "" for c in chat if c.choices)


def test_64_concurrent_streams(server, llm):
    prompts = [f"Write one sentence about the number {i}." for i in range(64)]
    expected = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    before = server.metrics()
    aclient = openai.AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)

    async def one(prompt):
        stream = await aclient.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16,
                                                  stream=True, extra_body={"ignore_eos": True})
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def run_all():
        return await asyncio.gather(*(one(p) for p in prompts))

    results = asyncio.run(run_all())
    assert [r[0] for r in results] == [o.outputs[0].text for o in expected]
    assert all(r[1] == "length" for r in results)
    after = wait_until_idle(server)
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 64
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 64 * 16
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] == 64
    assert after["vllm:kv_cache_usage_perc"] == 0.0


# Each OpenTelemetry gen_ai.server.* histogram (Prometheus' spelling) and its vllm:* twin.
GEN_AI_TWINS = {
    "gen_ai_server_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "gen_ai_server_time_per_output_token_seconds": "vllm:request_time_per_output_token_seconds",
    "gen_ai_server_request_duration_seconds": "vllm:e2e_request_latency_seconds",
}


def test_gen_ai_metrics_beside_vllm_metrics(server, client):
    """Both families on /metrics, with equal sums and counts over the same (successful) requests."""
    before = wait_until_idle(server)
    chat = dict(model=MODEL, messages=MESSAGES, max_tokens=6, extra_body={"ignore_eos": True})
    client.chat.completions.create(**chat)
    list(client.chat.completions.create(**chat, stream=True))
    for prompt in ("The sky is", "One, two,"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, extra_body={"ignore_eos": True})
    after = wait_until_idle(server)
    for genai, vllm in GEN_AI_TWINS.items():
        counts = [after[f"{name}_count"] - before.get(f"{name}_count", 0.0) for name in (genai, vllm)]
        sums = [after[f"{name}_sum"] - before.get(f"{name}_sum", 0.0) for name in (genai, vllm)]
        assert counts == [4, 4], genai
        assert sums[0] == pytest.approx(sums[1], rel=1e-9, abs=1e-9) and sums[0] > 0, genai
    status, body = server.request("GET", "/metrics")
    text = body.decode()
    for operation in ("chat", "text_completion"):
        assert re.search(r'gen_ai_server_request_duration_seconds_count\{[^}]*gen_ai_operation_name="%s"[^}]*'
                         r'gen_ai_provider_name="tracevllm",gen_ai_request_model="%s"' % (operation, MODEL), text)
    reasons = re.findall(r'vllm:num_requests_waiting_by_reason\{[^}]*reason="(\w+)"\} 0.0', text)
    assert sorted(reasons) == sorted(get_args(WaitingReason))


@pytest.mark.parametrize("num_lines", [2, 6, 11])  # leave at different moments of the stream
def test_client_disconnect_aborts_and_frees_blocks(server, num_lines):
    body = json.dumps({"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 900,
                       "ignore_eos": True, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    response = conn.getresponse()
    assert response.status == 200
    for _ in range(num_lines):  # some tokens: the request is running and holds KV blocks
        response.readline()
    assert server.metrics()["vllm:kv_cache_usage_perc"] > 0
    conn.sock.close()
    conn.close()
    # 900 tokens would take far longer than this: only an abort can free the blocks so soon.
    m = wait_until_idle(server, timeout=10)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0


def test_client_that_gives_up_on_a_non_streaming_request_aborts_it(server):
    body = json.dumps({"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 900,
                       "ignore_eos": True})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=1.0)
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()
    m = wait_until_idle(server, timeout=10)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0


BAD_REQUESTS = [
    ("malformed JSON", "/v1/chat/completions", '{"model": "x", "messages": [', None),
    ("missing messages", "/v1/chat/completions", {"model": MODEL}, "messages"),
    ("max_tokens 0", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ("max_tokens < 0", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": -5}, "max_tokens"),
    ("max_tokens beyond the context", "/v1/chat/completions",
     {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": MAX_MODEL_LEN}, "max_completion_tokens"),
    ("temperature < 0", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "temperature": -0.5}, "temperature"),
    ("prompt longer than max_model_len", "/v1/completions", {"model": MODEL, "prompt": "hello " * 1100}, "prompt"),
    ("token id out of range", "/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**9]}, "prompt"),
    ("max_tokens a string", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": "ten"}, "max_tokens"),
    ("messages not a list", "/v1/chat/completions", {"model": MODEL, "messages": "hello"}, "messages"),
    ("temperature a string", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ("n not an integer", "/v1/completions", {"model": MODEL, "prompt": "Hi", "n": 1.5}, "n"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ("tools", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
]


@pytest.mark.parametrize("path,body,param", [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_400_in_openai_shape(server, path, body, param):
    status, raw = server.request("POST", path, body)
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    # ...and the server goes on serving.
    status, raw = server.request("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert status == 200 and len(json.loads(raw)["choices"]) == 1


def test_unknown_model_is_404_model_not_found(server, client):
    """As OpenAI and vLLM answer: 404 with code ``model_not_found`` (the client raises NotFoundError)."""
    status, raw = server.request("POST", "/v1/chat/completions", {"model": "gpt-17", "messages": MESSAGES})
    error = json.loads(raw)["error"]
    assert status == 404 and error["code"] == "model_not_found" and error["param"] == "model", raw
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-17", prompt="Hi", max_tokens=2)


def test_openai_client_sees_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=-1)
    assert e.value.status_code == 400 and "temperature" in e.value.message


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}])
def test_api_key_required(server, headers):
    for method, path in (("GET", "/v1/models"), ("GET", "/version"), ("GET", "/metrics"), ("GET", "/docs"),
                         ("GET", "/openapi.json"), ("POST", "/tokenize")):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request(method, path, body=json.dumps({"prompt": "Hi"}) if method == "POST" else None, headers=headers)
        response = conn.getresponse()
        body = json.loads(response.read())
        assert response.status == 401 and set(body["error"]) == {"message", "type", "param", "code"}, path
        conn.close()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).models.list()
    assert server.request("GET", "/health", headers={"Authorization": ""})[0] == 200  # the one open route


def test_bench_serve_against_the_server(server, capsys):
    import argparse

    from tracevllm.benchmarks.serve import add_cli_args, run_serve_benchmark

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--base-url", f"http://127.0.0.1:{server.port}", "--api-key", API_KEY, "--num-prompts", "6",
        "--max-concurrency", "3", "--random-input-len", "16", "--random-output-len", "5", "--disable-tqdm",
    ])
    assert run_serve_benchmark(args) == 0
    report = capsys.readouterr().out
    assert re.search(r"Successful requests:\s+6\s", report) and re.search(r"Failed requests:\s+0\s", report)
    assert re.search(r"Total generated tokens:\s+30\s", report)
