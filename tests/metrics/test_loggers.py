"""IterationStats from engine-core outputs, and the Prometheus and log-line loggers fed by them."""

from __future__ import annotations

import logging

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from tracevllm.core.events import RequestQueued, RequestScheduled
from tracevllm.engine import EngineCoreOutput, SchedulerStats
from tracevllm.metrics.loggers import WAITING_REASONS, LoggingStatLogger, PrometheusStatLogger
from tracevllm.metrics.stats import IterationStats, RequestStateStats


def samples(logger: PrometheusStatLogger) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(logger.generate_latest().decode()):
        for s in family.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    return values


def test_iteration_stats_follow_one_request():
    req = RequestStateStats(arrival_time=100.0)
    events = [RequestQueued("r", 100.5, 7, 0), RequestScheduled("r", 101.0, 7, 0, [], [0])]
    first = IterationStats(iteration_timestamp=102.0)
    first.update_from_output(EngineCoreOutput("r", [5], events=events), num_prompt_tokens=7, req_stats=req)
    assert (first.num_prompt_tokens, first.num_generation_tokens, first.time_to_first_tokens_iter) == (7, 1, [2.0])
    second = IterationStats(iteration_timestamp=102.25)
    second.update_from_output(EngineCoreOutput("r", [6]), num_prompt_tokens=7, req_stats=req)
    req.finished_ts = 102.25
    second.update_from_finished_request("length", 7, req, "chat")
    assert (second.num_prompt_tokens, second.inter_token_latencies_iter) == (0, [0.25])
    done = second.finished_requests[0]
    assert (done.e2e_latency, done.queued_time, done.prefill_time, done.decode_time) == (2.25, 0.5, 1.0, 0.25)
    assert (done.first_token_latency, done.mean_time_per_output_token) == (2.0, 0.25)
    assert (done.num_prompt_tokens, done.num_generation_tokens, done.operation_name) == (7, 2, "chat")


def test_prometheus_metrics_have_vllm_names_and_values():
    logger = PrometheusStatLogger("m", num_gpu_blocks=100, block_size=16)
    req = RequestStateStats(arrival_time=0.0)
    stats = IterationStats(iteration_timestamp=1.0)
    stats.update_from_output(EngineCoreOutput("r", [5]), 10, req)
    req.finished_ts = 1.0
    stats.update_from_finished_request("stop", 10, req, "text_completion")
    logger.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.25,
                                 prefix_cache_queries=32, prefix_cache_hits=16, num_preemptions=1), stats)
    logger.record(SchedulerStats(num_running_reqs=1, prefix_cache_queries=8), None)
    s = samples(logger)
    assert s["vllm:num_requests_running"] == 1 and s["vllm:num_requests_waiting"] == 0
    assert s["vllm:kv_cache_usage_perc"] == 0.0
    assert s["vllm:prefix_cache_queries_total"] == 40 and s["vllm:prefix_cache_hits_total"] == 16
    assert s["vllm:num_preemptions_total"] == 1
    assert s["vllm:prompt_tokens_total"] == 10 and s["vllm:generation_tokens_total"] == 1
    assert s["vllm:request_success_total"] == 1
    assert s["vllm:time_to_first_token_seconds_count"] == 1 and s["vllm:time_to_first_token_seconds_sum"] == 1.0
    assert s["vllm:e2e_request_latency_seconds_count"] == 1
    # One token: no token after the first, and vLLM's 0 for its time per output token.
    assert s["vllm:request_time_per_output_token_seconds_count"] == 1
    assert s["vllm:request_time_per_output_token_seconds_sum"] == 0.0
    for name in ("vllm:inter_token_latency_seconds_count", "vllm:request_queue_time_seconds_count"):
        assert name in s


def waiting_by_reason(logger: PrometheusStatLogger) -> dict[str, float]:
    family = next(f for f in text_string_to_metric_families(logger.generate_latest().decode())
                  if f.name == "vllm:num_requests_waiting_by_reason")
    return {s.labels["reason"]: s.value for s in family.samples if s.labels["model_name"] == "m"}


def test_waiting_by_reason_shows_every_reason_from_the_latest_stats():
    logger = PrometheusStatLogger("m", num_gpu_blocks=100, block_size=16)
    assert waiting_by_reason(logger) == dict.fromkeys(WAITING_REASONS, 0.0)  # before any step
    logger.record(SchedulerStats(num_waiting_reqs=5, num_waiting_reqs_by_reason={"kv_cache": 2, "queued_behind": 3}),
                  None)
    assert waiting_by_reason(logger) == {**dict.fromkeys(WAITING_REASONS, 0.0), "kv_cache": 2, "queued_behind": 3}
    logger.record(SchedulerStats(num_waiting_reqs=1, num_waiting_reqs_by_reason={"token_budget": 1}), None)
    assert waiting_by_reason(logger) == {**dict.fromkeys(WAITING_REASONS, 0.0), "token_budget": 1}
    logger.record(None, IterationStats())  # no scheduler stats: the gauge keeps its values
    assert waiting_by_reason(logger)["token_budget"] == 1


def test_scheduler_stats_carry_the_reasons_across_processes():
    stats = SchedulerStats(num_waiting_reqs=2, num_waiting_reqs_by_reason={"max_num_seqs": 2})
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(stats), type=SchedulerStats) == stats
    assert SchedulerStats().num_waiting_reqs_by_reason == {}


def test_log_line(caplog):
    logger = LoggingStatLogger()
    stats = IterationStats()
    stats.num_prompt_tokens, stats.num_generation_tokens = 100, 20
    logger.record(SchedulerStats(num_running_reqs=4, num_waiting_reqs=1, kv_cache_usage=0.5,
                                 prefix_cache_queries=10, prefix_cache_hits=5), stats)
    with caplog.at_level(logging.INFO, logger="tracevllm"):
        logger.log()
    line = caplog.records[-1].getMessage()
    assert "Running: 4 reqs, Waiting: 1 reqs, GPU KV cache usage: 50.0%, Prefix cache hit rate: 50.0%" in line
    assert "Avg prompt throughput" in line and "Avg generation throughput" in line
