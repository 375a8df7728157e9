"""OpenTelemetry's GenAI model-server metrics (``gen_ai.server.*``), beside vLLM's ``vllm:*``.

The GenAI semantic conventions define three histograms for a server that runs a model, in seconds.
Each has a vLLM twin, and both read the same field of the request's ``FinishedRequestStats``::

    gen_ai.server.time_to_first_token     vllm:time_to_first_token_seconds             first_token_latency
    gen_ai.server.time_per_output_token   vllm:request_time_per_output_token_seconds   mean_time_per_output_token
    gen_ai.server.request.duration        vllm:e2e_request_latency_seconds             e2e_latency

So over requests that finished successfully (``stop`` or ``length``) with two tokens or more, each
pair has the same sum and count. They part only where the conventions say more than vLLM does:

- the first two are "for successful responses": a request that ends in an error (finish reason
  ``error``: the engine core refused it, or could not sample it) has a duration only, with
  ``error.type`` set to its finish reason; vLLM counts its TTFT and TPOT all the same. (A request the
  client aborted reaches no stat logger, in either family.)
- TTFT is recorded when the request finishes, where vLLM records it as the first token arrives
  (a scrape in between sees the request in vLLM's histogram only);
- a response of one token has no time per output token (vLLM records 0 for it).

Every point carries ``gen_ai.operation.name`` (``chat`` or ``text_completion``),
``gen_ai.provider.name`` (``tracevllm``), ``gen_ai.request.model`` and ``gen_ai.response.model``
(the served model: one per server), the values the ``llm_request`` span carries. ``server.address``
and ``server.port`` are left out: ``AsyncLLM``, which records these, does not know which address a
request came in on.

The OpenTelemetry SDK aggregates them (``otel.make_meter_provider``): ``GET /metrics`` renders them
with the ``vllm:*`` metrics, in Prometheus' spelling (``gen_ai_server_time_to_first_token_seconds``,
labels ``gen_ai_operation_name`` and so on, and a ``target_info`` carrying the traces' resource), and
with ``--otlp-metrics-endpoint`` they are exported over OTLP as well.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tracevllm.engine import FinishReason, SchedulerStats
from tracevllm.metrics.loggers import StatLoggerBase
from tracevllm.metrics.stats import FinishedRequestStats, IterationStats
from tracevllm.tracing.otel import make_meter_provider
from tracevllm.tracing.schema import GenAI, GenAIValue

TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
REQUEST_DURATION = "gen_ai.server.request.duration"
ERROR_TYPE = "error.type"
SUCCESSFUL_FINISH_REASONS = (str(FinishReason.STOP), str(FinishReason.LENGTH))

# Bucket boundaries as the conventions recommend, in seconds.
_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]


class GenAIStatLogger(StatLoggerBase):
    """The three ``gen_ai.server.*`` histograms of ``model_name``'s requests, rendered in ``registry``
    (the ``PrometheusStatLogger``'s) and, with ``otlp_metrics_endpoint``, exported over OTLP."""

    def __init__(self, model_name: str, registry: CollectorRegistry, otlp_metrics_endpoint: str | None = None) -> None:
        self.meter_provider = make_meter_provider(registry, otlp_metrics_endpoint)
        meter = self.meter_provider.get_meter("tracevllm")
        self.time_to_first_token = meter.create_histogram(
            TIME_TO_FIRST_TOKEN, unit="s", description="Time to generate first token for successful responses.",
            explicit_bucket_boundaries_advisory=_TTFT_BUCKETS,
        )
        self.time_per_output_token = meter.create_histogram(
            TIME_PER_OUTPUT_TOKEN, unit="s",
            description="Time per output token generated after the first token for successful responses.",
            explicit_bucket_boundaries_advisory=_TPOT_BUCKETS,
        )
        self.request_duration = meter.create_histogram(
            REQUEST_DURATION, unit="s",
            description="Generative AI server request duration such as time-to-last byte or last output token.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.model_name = model_name

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        if iteration_stats is None:
            return
        for finished in iteration_stats.finished_requests:
            attributes = self._attributes(finished)
            if finished.finish_reason not in SUCCESSFUL_FINISH_REASONS:
                self.request_duration.record(finished.e2e_latency, {**attributes, ERROR_TYPE: finished.finish_reason})
                continue
            self.request_duration.record(finished.e2e_latency, attributes)
            if finished.num_generation_tokens > 0:
                self.time_to_first_token.record(finished.first_token_latency, attributes)
            if finished.num_generation_tokens > 1:
                self.time_per_output_token.record(finished.mean_time_per_output_token, attributes)

    def _attributes(self, finished: FinishedRequestStats) -> dict[str, str]:
        return {
            GenAI.OPERATION_NAME: finished.operation_name,
            GenAI.PROVIDER_NAME: GenAIValue.PROVIDER,
            GenAI.REQUEST_MODEL: self.model_name,
            GenAI.RESPONSE_MODEL: self.model_name,
        }
