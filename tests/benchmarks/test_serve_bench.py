"""``tracevllm bench serve``: the metrics on hand-made results, the random dataset, and whole runs against a
fake OpenAI streaming server (FastAPI + uvicorn in a thread) that can reject or break chosen requests."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tracevllm.benchmarks.serve import (
    RequestFuncOutput,
    add_cli_args,
    calculate_metrics,
    run_serve_benchmark,
    sample_random_requests,
    send_times,
)

CHUNKS = 4  # tokens the fake server streams per request


def output(prompt_len, output_tokens, ttft, latency, itl, success=True) -> RequestFuncOutput:
    return RequestFuncOutput(success, prompt_len, output_tokens, ttft, itl, latency)


def test_calculate_metrics():
    outputs = [
        output(10, 5, 0.1, 0.5, [0.1] * 4),  # TPOT (0.5 - 0.1) / 4 = 0.1
        output(20, 3, 0.2, 0.6, [0.2, 0.2]),  # TPOT 0.2
        output(30, 1, 0.3, 0.3, []),  # one token: no TPOT
        output(40, 7, 9.0, 9.0, [9.0], success=False),  # failed: counted as a failure only
    ]
    m = calculate_metrics(outputs, duration_s=2.0, percentiles=[50, 99])
    assert (m.completed, m.failed, m.total_input, m.total_output) == (3, 1, 60, 9)
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(4.5)
    assert m.total_token_throughput == pytest.approx(34.5)
    assert m.ttft.mean_ms == pytest.approx(200) and m.ttft.median_ms == pytest.approx(200)
    assert [p for p, _ in m.ttft.percentiles_ms] == [50, 99]
    assert m.ttft.percentiles_ms[0][1] == pytest.approx(200)
    assert m.ttft.percentiles_ms[1][1] == pytest.approx(298)  # linear interpolation in [100, 200, 300]
    assert m.tpot.mean_ms == pytest.approx(150) and m.tpot.median_ms == pytest.approx(150)
    assert m.itl.mean_ms == pytest.approx(800 / 6) and m.itl.median_ms == pytest.approx(100)
    assert m.e2el.mean_ms == pytest.approx(1400 / 3) and m.e2el.median_ms == pytest.approx(500)


def test_calculate_metrics_when_all_failed():
    m = calculate_metrics([output(10, 0, 0.0, 0.0, [], success=False)] * 2, duration_s=1.0, percentiles=[99])
    assert (m.completed, m.failed, m.total_output, m.request_throughput) == (0, 2, 0, 0.0)
    assert m.ttft.mean_ms == m.tpot.percentiles_ms[0][1] == m.itl.median_ms == 0.0


def test_random_dataset():
    tokenizer = SimpleNamespace(vocab_size=20, all_special_ids=[0, 5, 19])
    requests = sample_random_requests(tokenizer, 200, input_len=10, output_len=4, range_ratio=0.5, seed=3)
    assert len(requests) == 200
    assert {len(p) for p, _ in requests} == set(range(5, 16))  # [floor(10 * 0.5), ceil(10 * 1.5)]
    assert {n for _, n in requests} == {2, 3, 4, 5, 6}
    tokens = {t for p, _ in requests for t in p}
    assert tokens == set(range(20)) - {0, 5, 19}
    assert all(isinstance(t, int) for t in tokens)
    assert requests == sample_random_requests(tokenizer, 200, 10, 4, 0.5, seed=3)
    assert requests != sample_random_requests(tokenizer, 200, 10, 4, 0.5, seed=4)
    fixed = sample_random_requests(tokenizer, 5, 7, 3, 0.0, seed=0)
    assert all(len(p) == 7 and n == 3 for p, n in fixed)
    with pytest.raises(ValueError):
        sample_random_requests(tokenizer, 5, 7, 3, 1.0, seed=0)


def test_send_times():
    assert send_times(5, float("inf"), 1.0, seed=0).tolist() == [0.0] * 5
    for burstiness in (1.0, 0.5):  # Poisson, burstier
        times = send_times(20001, 50.0, burstiness, seed=0)
        assert times[0] == 0.0 and (times[1:] >= times[:-1]).all()
        assert times[-1] / 20000 == pytest.approx(1 / 50, rel=0.05)  # mean gap 1 / rate
        gaps = times[1:] - times[:-1]
        assert gaps.std() / gaps.mean() == pytest.approx(burstiness ** -0.5, rel=0.05)  # gamma's CV


class FakeServer:
    """An OpenAI-like streaming /v1/completions: CHUNKS text chunks a few ms apart, a usage chunk and
    [DONE]; the requests that arrive in ``reject`` get a 400, those in ``break_midway`` an error event.
    ``held_back``: the second token's text is held back (an empty chunk), the finish reason comes in a
    chunk of its own, and there is no usage chunk."""

    def __init__(self):
        self.reset()
        self.app = FastAPI()
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/completions")(self.completions)

    def reset(self, reject=(), break_midway=(), held_back=False):
        self.reject, self.break_midway, self.held_back = set(reject), set(break_midway), held_back
        self.payloads, self.active, self.peak = [], 0, 0

    async def models(self):
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    async def completions(self, request: Request):
        body = await request.json()
        index = len(self.payloads)
        self.payloads.append(body)
        if index in self.reject:
            error = {"message": "rejected by the test", "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        self.active += 1
        self.peak = max(self.peak, self.active)
        return StreamingResponse(self.stream(index), media_type="text/event-stream")

    async def stream(self, index: int):
        def sse(data: dict) -> str:
            return f"data: {json.dumps(data)}\n\n"

        for i in range(CHUNKS):
            await asyncio.sleep(0.01)
            if index in self.break_midway and i == 2:
                self.active -= 1  # before the client can see the end of this request
                yield sse({"error": {"message": "broken by the test", "type": "InternalServerError"}})
                return
            text = "" if self.held_back and i == 1 else f" t{i}"
            finish = "length" if i == CHUNKS - 1 and not self.held_back else None
            yield sse(self.chunk(index, text, finish))
        if self.held_back:
            yield sse(self.chunk(index, "", "length"))
        else:
            yield sse({"id": f"cmpl-{index}", "choices": [],
                       "usage": {"prompt_tokens": 8, "completion_tokens": CHUNKS, "total_tokens": 8 + CHUNKS}})
        self.active -= 1
        yield "data: [DONE]\n\n"


    @staticmethod
    def chunk(index: int, text: str, finish_reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {"id": f"cmpl-{index}", "object": "text_completion", "choices": [choice]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fake_server():
    fake = FakeServer()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(fake.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    fake.base_url = f"http://127.0.0.1:{port}"
    yield fake
    server.should_exit = True
    thread.join(timeout=10)


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(["--random-input-len", "8", "--random-output-len", str(CHUNKS), "--disable-tqdm",
                              *argv])


def test_serve_benchmark_counts_failures(fake_server, bundled_model_dir, tmp_path, capsys):
    fake_server.reset(reject={1}, break_midway={4})
    result_file = tmp_path / "result.json"
    args = bench_args("--base-url", fake_server.base_url, "--tokenizer", bundled_model_dir, "--num-prompts", "10",
                      "--metric-percentiles", "50,99", "--result-filename", str(result_file))
    assert run_serve_benchmark(args) == 0
    out, err = capsys.readouterr()
    assert "Serving Benchmark Result" in out and "P99 TTFT (ms):" in out and "P50 ITL (ms):" in out
    assert err.count("first failed request") == 1 and "rejected by the test" in err
    result = json.loads(result_file.read_text())
    assert (result["completed"], result["failed"]) == (8, 2)
    assert (result["total_input"], result["total_output"]) == (8 * 8, 8 * CHUNKS)
    assert result["model"] == "fake-model" and result["request_rate"] == "inf"
    ok = [r for r in result["requests"] if r["success"]]
    assert all(len(r["itl"]) == CHUNKS - 1 and 0 < r["ttft"] < r["latency"] for r in ok)
    payload = fake_server.payloads[0]
    assert payload["model"] == "fake-model" and len(payload["prompt"]) == 8
    assert all(isinstance(t, int) for t in payload["prompt"])
    assert payload["max_tokens"] == CHUNKS and payload["ignore_eos"] is True and payload["stream"] is True
    assert payload["stream_options"] == {"include_usage": True} and payload["temperature"] == 0.0


def test_serve_benchmark_max_concurrency(fake_server, bundled_model_dir, tmp_path):
    fake_server.reset()
    result_file = tmp_path / "result.json"
    args = bench_args("--base-url", fake_server.base_url, "--tokenizer", bundled_model_dir, "--num-prompts", "12",
                      "--max-concurrency", "2", "--request-rate", "500", "--model", "named-model",
                      "--result-filename", str(result_file))
    assert run_serve_benchmark(args) == 0
    assert fake_server.peak == 2
    assert {p["model"] for p in fake_server.payloads} == {"named-model"}
    result = json.loads(result_file.read_text())
    assert (result["completed"], result["failed"], result["total_output"]) == (12, 0, 12 * CHUNKS)


def test_serve_benchmark_soak_keeps_the_concurrency_for_the_duration(fake_server, bundled_model_dir, tmp_path,
                                                                      capsys):
    fake_server.reset()
    result_file = tmp_path / "result.json"
    args = bench_args("--base-url", fake_server.base_url, "--tokenizer", bundled_model_dir, "--num-prompts", "3",
                      "--max-concurrency", "4", "--duration", "1.0", "--result-filename", str(result_file))
    started = time.perf_counter()
    assert run_serve_benchmark(args) == 0
    elapsed = time.perf_counter() - started
    result = json.loads(result_file.read_text())
    # Each request streams CHUNKS chunks 10 ms apart: a second at concurrency 4 sends far more than 3.
    assert result["completed"] > 3 * 4 and result["failed"] == 0
    assert fake_server.peak == 4
    assert 1.0 <= result["duration_s"] < elapsed
    prompts = {tuple(p["prompt"]) for p in fake_server.payloads}
    assert len(prompts) == 3  # the 3 prompts, cycled
    gaps = [gap for r in result["requests"] for gap in r["itl"]]
    assert result["max_itl_ms"] == pytest.approx(max(gaps) * 1000)
    assert "Longest gap in any stream (ms):" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--duration"):
        run_serve_benchmark(bench_args("--base-url", fake_server.base_url, "--duration", "5"))


def test_serve_benchmark_counts_token_chunks_without_usage(fake_server, bundled_model_dir, tmp_path):
    fake_server.reset(held_back=True)
    result_file = tmp_path / "result.json"
    args = bench_args("--base-url", fake_server.base_url, "--tokenizer", bundled_model_dir, "--num-prompts", "3",
                      "--result-filename", str(result_file))
    assert run_serve_benchmark(args) == 0
    result = json.loads(result_file.read_text())
    assert (result["completed"], result["total_output"]) == (3, 3 * CHUNKS)
    assert all(len(r["itl"]) == CHUNKS - 1 for r in result["requests"])


def test_serve_benchmark_all_failed(fake_server, bundled_model_dir, capsys):
    fake_server.reset(reject=range(3))
    args = bench_args("--base-url", fake_server.base_url, "--tokenizer", bundled_model_dir, "--num-prompts", "3")
    assert run_serve_benchmark(args) == 1
    assert "all 3 requests failed" in capsys.readouterr().err


def test_serve_benchmark_unreachable_server(capsys):
    args = bench_args("--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "2")
    assert run_serve_benchmark(args) == 1
    assert "is the server running there?" in capsys.readouterr().err
