"""Stat loggers: the periodic log line and the Prometheus metrics, both fed by the front end.

Every ``EngineCoreOutputs`` the front end processes calls ``record(scheduler_stats,
iteration_stats)`` on each logger. ``LoggingStatLogger.log()`` (every 10 s from the server) prints a
line like vLLM's; ``PrometheusStatLogger`` keeps vLLM's metric names (``vllm:*``) in a registry of its
own that ``GET /metrics`` renders. OpenTelemetry's ``gen_ai.server.*`` metrics are rendered in the same
registry by ``GenAIStatLogger`` (``genai.py``), from the same ``FinishedRequestStats``.
"""

from __future__ import annotations

import logging
import time
from typing import get_args

import prometheus_client

from tracevllm.core.events import WaitingReason
from tracevllm.engine import SchedulerStats
from tracevllm.metrics.stats import IterationStats

logger = logging.getLogger("tracevllm")


class StatLoggerBase:
    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        raise NotImplementedError

    def log(self) -> None:
        pass


class LoggingStatLogger(StatLoggerBase):
    """Throughput since the last line, the latest gauges, and the prefix-cache hit rate so far.

    An idle engine logs at DEBUG level, so an idle server's log stays quiet.
    """

    def __init__(self, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.last_scheduler_stats = SchedulerStats()
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.last_log_time = now

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        if iteration_stats is not None:
            self.num_prompt_tokens += iteration_stats.num_prompt_tokens
            self.num_generation_tokens += iteration_stats.num_generation_tokens
        if scheduler_stats is not None:
            self.last_scheduler_stats = scheduler_stats
            self.prefix_cache_queries += scheduler_stats.prefix_cache_queries
            self.prefix_cache_hits += scheduler_stats.prefix_cache_hits

    def log(self) -> None:
        now = time.monotonic()
        elapsed = max(now - self.last_log_time, 1e-9)
        s = self.last_scheduler_stats
        hit_rate = self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        active = self.num_prompt_tokens or self.num_generation_tokens or s.num_running_reqs or s.num_waiting_reqs
        (logger.info if active else logger.debug)(
            "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
            self.engine_index, self.num_prompt_tokens / elapsed, self.num_generation_tokens / elapsed,
            s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage * 100, hit_rate * 100,
        )
        self._reset(now)


# Why a waiting request was left unscheduled in a step (SchedulerStats.num_waiting_reqs_by_reason):
# the scheduler's WaitingReason, each a label value of vllm:num_requests_waiting_by_reason.
WAITING_REASONS = get_args(WaitingReason)

# Buckets as vLLM's, in seconds.
_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0]


class PrometheusStatLogger(StatLoggerBase):
    """vLLM's Prometheus metrics, labelled ``model_name`` and ``engine``, in ``self.registry``."""

    def __init__(self, model_name: str, num_gpu_blocks: int, block_size: int, engine_index: int = 0) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        labels = ["model_name", "engine"]
        values = [model_name, str(engine_index)]

        def make(kind, name: str, doc: str, **kwargs):
            return kind(name, doc, labelnames=labels, registry=self.registry, **kwargs).labels(*values)

        G, C, H = prometheus_client.Gauge, prometheus_client.Counter, prometheus_client.Histogram
        self.num_requests_running = make(G, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_requests_waiting = make(G, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        waiting_by_reason = prometheus_client.Gauge(
            "vllm:num_requests_waiting_by_reason", "Number of requests waiting to be processed, by why they wait.",
            labelnames=labels + ["reason"], registry=self.registry,
        )
        self.num_requests_waiting_by_reason = {r: waiting_by_reason.labels(*values, r) for r in WAITING_REASONS}
        self.kv_cache_usage = make(G, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = make(C, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = make(C, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.num_preemptions = make(C, "vllm:num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prompt_tokens = make(C, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = make(C, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = prometheus_client.Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            labelnames=labels + ["finished_reason"], registry=self.registry,
        )
        self.request_success_labels = values
        self.time_to_first_token = make(H, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", buckets=_TTFT_BUCKETS)
        self.inter_token_latency = make(H, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", buckets=_ITL_BUCKETS)
        self.request_time_per_output_token = make(
            H, "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
            buckets=_ITL_BUCKETS,
        )
        self.e2e_request_latency = make(H, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", buckets=_LATENCY_BUCKETS)
        self.request_queue_time = make(H, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", buckets=_LATENCY_BUCKETS)
        self.request_prefill_time = make(H, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", buckets=_LATENCY_BUCKETS)
        self.request_decode_time = make(H, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", buckets=_LATENCY_BUCKETS)
        self.request_prompt_tokens = make(H, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets=_token_buckets())
        self.request_generation_tokens = make(H, "vllm:request_generation_tokens", "Number of generation tokens processed.", buckets=_token_buckets())
        info = prometheus_client.Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
            labelnames=["block_size", "num_gpu_blocks", "engine"], registry=self.registry,
        )
        info.labels(str(block_size), str(num_gpu_blocks), str(engine_index)).set(1)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        if scheduler_stats is not None:
            self.num_requests_running.set(scheduler_stats.num_running_reqs)
            self.num_requests_waiting.set(scheduler_stats.num_waiting_reqs)
            for reason, gauge in self.num_requests_waiting_by_reason.items():
                gauge.set(scheduler_stats.num_waiting_reqs_by_reason.get(reason, 0))
            self.kv_cache_usage.set(scheduler_stats.kv_cache_usage)
            self.prefix_cache_queries.inc(scheduler_stats.prefix_cache_queries)
            self.prefix_cache_hits.inc(scheduler_stats.prefix_cache_hits)
            self.num_preemptions.inc(scheduler_stats.num_preemptions)
        if iteration_stats is None:
            return
        self.prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        self.generation_tokens.inc(iteration_stats.num_generation_tokens)
        for ttft in iteration_stats.time_to_first_tokens_iter:
            self.time_to_first_token.observe(ttft)
        for itl in iteration_stats.inter_token_latencies_iter:
            self.inter_token_latency.observe(itl)
        for finished in iteration_stats.finished_requests:
            self.request_success.labels(*self.request_success_labels, finished.finish_reason).inc()
            self.e2e_request_latency.observe(finished.e2e_latency)
            self.request_time_per_output_token.observe(finished.mean_time_per_output_token)
            self.request_queue_time.observe(finished.queued_time)
            self.request_prefill_time.observe(finished.prefill_time)
            self.request_decode_time.observe(finished.decode_time)
            self.request_prompt_tokens.observe(finished.num_prompt_tokens)
            self.request_generation_tokens.observe(finished.num_generation_tokens)

    def generate_latest(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


def _token_buckets() -> list[int]:
    """1, 2, 5, 10, 20, 50, … up to 100k tokens."""
    return [m * 10**e for e in range(6) for m in (1, 2, 5)]
