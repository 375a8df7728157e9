"""``tracevllm serve --trace-out``: one trace per request across both processes, rooted at the HTTP
request (continuing a caller's ``traceparent``), and step traces linked to their requests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.server_utils import RemoteServer
from tests.trace_utils import load_spans

pytestmark = pytest.mark.slow

CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"


def test_request_traces_span_both_processes(bundled_model_dir, tmp_path):
    trace_dir = tmp_path / "traces"
    with RemoteServer(["--dtype", "float32", "--max-model-len", "512", "--trace-out", str(trace_dir)]) as server:
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
    # SIGTERM: both processes flush their files on the way out.
    spans = [(s["resource"], s) for s in load_spans(trace_dir)]
    processes = {resource["tracevllm.process"] for resource, _ in spans}
    assert processes == {"MainProcess", "EngineCore"}
    by_id = {s["spanId"]: s for _, s in spans}
    children: dict[str, list[dict]] = {}
    for _, s in spans:
        children.setdefault(s.get("parentSpanId", ""), []).append(s)
    servers = [s for _, s in spans if s["name"] == "POST /v1/chat/completions"]
    assert len(servers) == 4 and all(s["kind"] == 2 for s in servers)  # SPAN_KIND_SERVER
    continued = [s for s in servers if s["traceId"] == CALLER_TRACE_ID]
    assert len(continued) == 1 and continued[0]["parentSpanId"] == CALLER_SPAN_ID
    for server_span in servers:
        names = sorted(c["name"] for c in children[server_span["spanId"]])
        assert names == ["llm_request", "tokenize"]
        root = next(c for c in children[server_span["spanId"]] if c["name"] == "llm_request")
        stages = {c["name"] for c in children[root["spanId"]]}
        assert stages == {"EngineCoreRequest", "scheduler.request", "prefill", "decode", "detokenize", "RequestOutput"}
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
