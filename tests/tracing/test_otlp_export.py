"""Live OTLP export from a real engine run, over gRPC and HTTP, and a collector that is down."""

from __future__ import annotations

import time

import pytest

from tests.otlp_receiver import OtlpReceiver, attributes
from tests.server_utils import free_port
from tracevllm import LLM, SamplingParams

STAGES = {"llm_request", "tokenize", "scheduler.request", "prefill", "decode", "detokenize", "engine_step", "schedule",
          "execute_model", "sample", "update_from_output", "Overall Loading", "EngineCore init"}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_arrive_live(tiny_checkpoint, monkeypatch, protocol):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the SDK's batch delay, in ms
    monkeypatch.setenv("OTEL_SERVICE_NAME", f"tracevllm-{protocol}")
    with OtlpReceiver() as rx:
        endpoint = rx.grpc_endpoint if protocol == "grpc" else rx.http_endpoint
        llm = LLM(tiny_checkpoint("llama"), dtype="float32", otlp_traces_endpoint=endpoint)
        out = llm.generate("Hello there", SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3
        rx.wait_for(lambda rx: STAGES <= set(rx.span_names()), timeout=20)
        resource, root = next((r, s) for r, s in rx.spans() if s.name == "llm_request")
        assert resource["service.name"] == f"tracevllm-{protocol}"  # OTEL_SERVICE_NAME is honoured
        assert attributes(root.attributes)["gen_ai.usage.completion_tokens"] == 3
        resource, scheduler_span = next((r, s) for r, s in rx.spans() if s.name == "scheduler.request")
        assert resource["service.name"] == f"tracevllm-{protocol}.engine_core"
        assert scheduler_span.trace_id == root.trace_id and scheduler_span.parent_span_id == root.span_id


def test_a_collector_that_is_down_does_not_stall_generation(tiny_checkpoint):
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", otlp_traces_endpoint=f"http://127.0.0.1:{free_port()}")
    start = time.perf_counter()
    for _ in range(3):
        out = llm.generate("Hello there", SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3
    assert time.perf_counter() - start < 20  # no export timeout (10 s each) on the way
