"""``tracevllm serve --trace-out --otlp-traces-endpoint``: one trace per request across both
processes (two services), rooted at the HTTP request (continuing a caller's ``traceparent``), step
traces linked to their requests, a start-up trace across both processes, and the same spans in the
files and at a live OTLP receiver."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.otlp_receiver import OtlpReceiver
from tests.server_utils import RemoteServer, free_port
from tests.trace_utils import attrs, load_spans, step_block_changes

pytestmark = pytest.mark.slow

CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"


def test_request_traces_span_both_processes(bundled_model_dir, tmp_path, monkeypatch):
    trace_dir = tmp_path / "traces"
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # the server inherits it: live batches every 200 ms
    with OtlpReceiver() as rx, RemoteServer([
        "--dtype", "float32", "--max-model-len", "512", "--trace-out", str(trace_dir),
        "--otlp-traces-endpoint", rx.grpc_endpoint,
    ]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)

        def chat(i):
            headers = {"traceparent": f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"} if i == 0 else {}
            return client.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": f"Count to {i + 2}."}],
                max_tokens=6, extra_headers=headers, stream=i % 2 == 1,
            )

        with ThreadPoolExecutor(4) as pool:
            for result in pool.map(chat, range(4)):
                list(result) if not hasattr(result, "choices") else None
        # SIGTERM: both processes flush their files (and their live exports) on the way out.
        server.stop()
        file_span_ids = {s["spanId"] for s in load_spans(trace_dir)}
        live_span_ids = lambda rx: {span.span_id.hex() for _, span in rx.spans()}  # noqa: E731
        rx.wait_for(lambda rx: live_span_ids(rx) == file_span_ids, timeout=20)
    spans = [(s["resource"], s) for s in load_spans(trace_dir)]
    processes = {resource["tracevllm.process"]: resource["service.name"] for resource, _ in spans}
    assert processes == {"MainProcess": "tracevllm", "EngineCore": "tracevllm.engine_core"}
    assert {resource["service.namespace"] for resource, _ in spans} == {"tracevllm"}
    by_id = {s["spanId"]: s for _, s in spans}
    children: dict[str, list[dict]] = {}
    for _, s in spans:
        children.setdefault(s.get("parentSpanId", ""), []).append(s)
    servers = [s for _, s in spans if s["name"] == "POST /v1/chat/completions"]
    assert len(servers) == 4 and all(s["kind"] == 2 for s in servers)  # SPAN_KIND_SERVER
    continued = [s for s in servers if s["traceId"] == CALLER_TRACE_ID]
    assert len(continued) == 1 and continued[0]["parentSpanId"] == CALLER_SPAN_ID
    for server_span in servers:
        (root,) = children[server_span["spanId"]]
        assert root["name"] == "llm_request" and attrs(root)["gen_ai.operation.name"] == "chat"
        stages = {c["name"] for c in children[root["spanId"]]}
        assert stages == {"tokenize", "scheduler.request", "prefill", "decode", "detokenize"}
        assert all(c["traceId"] == server_span["traceId"] for c in children[root["spanId"]])
        scheduler_span = next(c for c in children[root["spanId"]] if c["name"] == "scheduler.request")
        events = [e["name"] for e in scheduler_span["events"]]
        assert events[0] == "QUEUED" and "SCHEDULED" in events and events[-1] == "FINISHED"
    # Every engine step links to the scheduler.request spans of the requests it ran.
    scheduler_spans = {s["spanId"] for _, s in spans if s["name"] == "scheduler.request"}
    steps = [s for _, s in spans if s["name"] == "engine_step"]
    assert steps and all(s.get("links") for s in steps)
    assert {link["spanId"] for s in steps for link in s["links"]} == scheduler_spans
    assert all(by_id[link["spanId"]]["traceId"] == link["traceId"] for s in steps for link in s["links"])

    # Start-up is one trace across both processes: the engine core's init under "Start engine core".
    (engine_init,) = [s for _, s in spans if s["name"] == "EngineCore init"]
    start_core = by_id[engine_init["parentSpanId"]]
    assert start_core["name"] == "Start engine core"
    assert by_id[start_core["parentSpanId"]]["name"] == "Overall Loading"
    assert {c["name"] for c in children[engine_init["spanId"]]} == {"Load model", "Allocate KV cache", "Warmup",
                                                                    "Profile steps"}
    # The server on CPU fitted its token budget to a timed step, and chose its threads.
    (warmup,) = [s for _, s in spans if s["name"] == "Warmup"]
    assert 128 <= attrs(warmup)["scheduler.max_num_batched_tokens"] <= 2048  # max_num_seqs .. vLLM's default
    assert attrs(warmup)["warmup.step_seconds_per_token"] > 0
    (load_model,) = [s for _, s in spans if s["name"] == "Load model"]
    assert attrs(load_model)["cpu.threads"] >= 1

    # KV blocks add up: each request drops every block reference it took, and replaying the steps'
    # block changes gives, at every step, blocks in use + free blocks + the null block = all blocks.
    taken, dropped = step_block_changes([s for _, s in spans])
    assert len(taken) == 4 and taken == dropped
    refs: Counter = Counter()
    for a in sorted((attrs(s) for s in steps), key=lambda a: a["step.number"]):
        refs.update(a.get("step.blocks_allocated.block_ids", []))
        refs.subtract(a.get("step.blocks_freed.block_ids", []))
        in_use = sum(1 for n in refs.values() if n > 0)
        assert in_use + a["step.num_free_blocks"] + 1 == a["step.num_gpu_blocks"]


def test_a_collector_that_is_down_does_not_disturb_the_server(bundled_model_dir):
    with RemoteServer(["--dtype", "float32", "--max-model-len", "512",
                       "--otlp-traces-endpoint", f"http://127.0.0.1:{free_port()}"]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        for _ in range(3):
            response = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=4)
            assert response.usage.completion_tokens == 4
        assert server.request("GET", "/health")[0] == 200
