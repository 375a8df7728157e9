"""WorkerTracer: a worker's ``WorkerStepRecord``s as spans of the service ``tracevllm.worker``.

With tensor or pipeline parallelism every rank is its own process (or Ray actor, possibly on
another machine), and each exports its own spans, to its own ``--trace-out`` file or to the OTLP
endpoint. The record carries the engine step's trace context (``SchedulerOutput.step_context``, from
the engine core's tracer), so each rank's ``worker.execute_model`` lands in that step's trace, under
``engine_step``::

    engine_step 12                          (tracevllm.engine_core)
    ├─ schedule, execute_model, ...
    ├─ worker.execute_model  rank 0         (tracevllm.worker, process Worker-0)
    │  └─ pp.send
    └─ worker.execute_model  rank 1         (tracevllm.worker, process Worker-1)
       └─ pp.recv

With the pipeline's batch queue, a batch's workers run after the step that scheduled it has ended,
overlapping later steps: the replay draws them per rank, as the pipeline's timeline.

On ``EngineIdle`` (the engine core has no request left) it completes the rank's trace file.
"""

from __future__ import annotations

from opentelemetry import trace

from tracevllm.config import ObservabilityConfig
from tracevllm.core.events import EngineEvent, EngineIdle, WorkerStepRecord
from tracevllm.tracing.otel import extract_trace_context, flush_traces, init_tracer, seconds_to_ns
from tracevllm.tracing.schema import Attr, Service, SpanName


class WorkerTracer:
    def __init__(self, config: ObservabilityConfig) -> None:
        self.tracer = init_tracer(config, Service.WORKER)

    def on_event(self, event: EngineEvent) -> None:
        if isinstance(event, WorkerStepRecord) and event.step_context:
            self._worker_step(event)
        elif isinstance(event, EngineIdle):
            flush_traces()

    def _worker_step(self, event: WorkerStepRecord) -> None:
        start, end = seconds_to_ns(event.start_time), seconds_to_ns(event.end_time)
        span = self.tracer.start_span(
            SpanName.WORKER_EXECUTE_MODEL, context=extract_trace_context(event.step_context), start_time=start,
            attributes={Attr.WORKER_RANK: event.rank, Attr.WORKER_TP_RANK: event.tp_rank,
                        Attr.WORKER_PP_RANK: event.pp_rank, Attr.WORKER_NUM_TOKENS: event.num_tokens,
                        Attr.WORKER_COMM_TIME: event.comm_time_s},
        )
        parent = trace.set_span_in_context(span)
        if event.recv_time_s > 0:
            self.tracer.start_span(SpanName.PP_RECV, context=parent, start_time=start).end(
                end_time=start + seconds_to_ns(event.recv_time_s))
        if event.send_time_s > 0:
            self.tracer.start_span(SpanName.PP_SEND, context=parent,
                                   start_time=end - seconds_to_ns(event.send_time_s)).end(end_time=end)
        span.end(end_time=end)
