"""The gen_ai.server.* metrics: the same numbers as their vllm:* twins, with the GenAI conventions'
names, units, buckets and attributes, rendered beside them."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.otlp_receiver import OtlpReceiver, attributes
from tracevllm.engine import EngineCoreOutput
from tracevllm.metrics.genai import GenAIStatLogger
from tracevllm.metrics.loggers import PrometheusStatLogger
from tracevllm.metrics.stats import IterationStats, RequestStateStats

# Each gen_ai.server.* histogram and its vLLM twin, as /metrics spells them.
TWINS = {
    "gen_ai_server_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "gen_ai_server_time_per_output_token_seconds": "vllm:request_time_per_output_token_seconds",
    "gen_ai_server_request_duration_seconds": "vllm:e2e_request_latency_seconds",
}


def make_loggers() -> tuple[PrometheusStatLogger, GenAIStatLogger]:
    prometheus = PrometheusStatLogger("m", num_gpu_blocks=100, block_size=16)
    return prometheus, GenAIStatLogger("m", prometheus.registry)


def run_request(loggers, arrival: float, token_times: list[float], finish_reason: str = "length",
                operation: str = "text_completion") -> None:
    """One request as the output processor sees it: a token at each time, finished with the last."""
    req = RequestStateStats(arrival_time=arrival)
    for i, t in enumerate(token_times):
        stats = IterationStats(iteration_timestamp=t)
        stats.update_from_output(EngineCoreOutput("r", [i]), 5, req)
        if i == len(token_times) - 1:
            req.finished_ts = t
            stats.update_from_finished_request(finish_reason, 5, req, operation)
        for logger in loggers:
            logger.record(None, stats)


def scrape(prometheus: PrometheusStatLogger) -> list:
    return [s for f in text_string_to_metric_families(prometheus.generate_latest().decode()) for s in f.samples]


def totals(prometheus: PrometheusStatLogger) -> dict[str, float]:
    """{sample name: value summed over label sets}."""
    values: dict[str, float] = {}
    for s in scrape(prometheus):
        values[s.name] = values.get(s.name, 0.0) + s.value
    return values


def test_successful_requests_give_equal_sums_and_counts():
    prometheus, genai = loggers = make_loggers()
    run_request(loggers, 0.0, [0.3, 0.35, 0.41, 0.5], operation="chat")
    run_request(loggers, 1.0, [1.02, 1.2], finish_reason="stop")
    run_request(loggers, 2.0, [2.7, 2.75, 2.8, 2.85, 2.9, 3.0], operation="chat")
    values = totals(prometheus)
    for name, twin in TWINS.items():
        assert values[f"{name}_count"] == values[f"{twin}_count"] == 3, name
        assert abs(values[f"{name}_sum"] - values[f"{twin}_sum"]) < 1e-12, name
    assert abs(values["gen_ai_server_time_to_first_token_seconds_sum"] - (0.3 + 0.02 + 0.7)) < 1e-12
    assert abs(values["gen_ai_server_request_duration_seconds_sum"] - (0.5 + 0.2 + 1.0)) < 1e-12


def test_where_the_conventions_part_from_vllm():
    prometheus, genai = loggers = make_loggers()
    run_request(loggers, 0.0, [0.5])  # one token: no time per output token
    run_request(loggers, 1.0, [1.5, 1.6], finish_reason="error")  # failed: a duration only, with error.type
    values = totals(prometheus)
    assert values["vllm:request_time_per_output_token_seconds_count"] == 2
    assert "gen_ai_server_time_per_output_token_seconds_count" not in values
    assert values["vllm:time_to_first_token_seconds_count"] == 2
    assert values["gen_ai_server_time_to_first_token_seconds_count"] == 1
    assert values["vllm:e2e_request_latency_seconds_count"] == values["gen_ai_server_request_duration_seconds_count"]
    failed = [s for s in scrape(prometheus) if s.name == "gen_ai_server_request_duration_seconds_count"
              and s.labels.get("error_type")]
    assert [(s.labels["error_type"], s.value) for s in failed] == [("error", 1.0)]


def test_attributes_units_and_buckets_follow_the_conventions():
    prometheus, genai = loggers = make_loggers()
    run_request(loggers, 0.0, [0.1, 0.2], operation="chat")
    run_request(loggers, 0.0, [0.1, 0.2], operation="text_completion")
    samples = scrape(prometheus)
    counts = [s for s in samples if s.name == "gen_ai_server_request_duration_seconds_count"]
    assert sorted(s.labels["gen_ai_operation_name"] for s in counts) == ["chat", "text_completion"]
    for s in counts:
        assert s.labels["gen_ai_provider_name"] == "tracevllm"  # as on the llm_request span
        assert s.labels["gen_ai_request_model"] == s.labels["gen_ai_response_model"] == "m"
        assert "error_type" not in s.labels
    buckets = {
        "gen_ai_server_time_to_first_token_seconds":
            [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
        "gen_ai_server_time_per_output_token_seconds":
            [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
        "gen_ai_server_request_duration_seconds":
            [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92],
    }
    for name, bounds in buckets.items():
        les = [s.labels["le"] for s in samples if s.name == f"{name}_bucket"
               and s.labels["gen_ai_operation_name"] == "chat"]
        assert les == [str(float(b)) for b in bounds] + ["+Inf"], name
    # The resource is the traces' (otel.py): the front end's service, in the same namespace.
    target = next(s for s in samples if s.name == "target_info")
    assert (target.labels["service_name"], target.labels["service_namespace"]) == ("tracevllm", "tracevllm")
    assert target.labels["tracevllm_process"] == "MainProcess"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_export_carries_the_same_points(monkeypatch, protocol):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", protocol)
    with OtlpReceiver() as rx:
        prometheus = PrometheusStatLogger("m", num_gpu_blocks=100, block_size=16)
        genai = GenAIStatLogger("m", prometheus.registry, rx.grpc_endpoint if protocol == "grpc" else rx.http_endpoint)
        run_request([prometheus, genai], 0.0, [0.25, 0.5, 1.0], operation="chat")
        assert genai.meter_provider.force_flush(10_000)
        metrics = {m.name: (attributes(rm.resource.attributes), m) for r in rx.metric_requests
                   for rm in r.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        genai.meter_provider.shutdown()
    resource, duration = metrics["gen_ai.server.request.duration"]
    assert resource["service.name"] == "tracevllm" and duration.unit == "s"
    point = duration.histogram.data_points[0]
    assert (point.count, point.sum) == (1, 1.0)
    assert attributes(point.attributes) == {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "tracevllm",
                                            "gen_ai.request.model": "m", "gen_ai.response.model": "m"}
    assert metrics["gen_ai.server.time_to_first_token"][1].histogram.data_points[0].sum == 0.25
    assert metrics["gen_ai.server.time_per_output_token"][1].histogram.data_points[0].sum == 0.375
