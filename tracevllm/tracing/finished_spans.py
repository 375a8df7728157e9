"""``FinishedSpans``: spans made whole, once everything about them is known, and handed to the exporters.

An ``engine_step`` trace is drawn after its step is over (``engine_tracer.py``): every start, end,
attribute and link is known at once. Made through ``Tracer.start_span`` and ``Span.end``, each span
would still go through what a span whose future is unknown needs: the sampler, a lock around its
attributes, every element of each list attribute checked (a step's batch is a dozen lists, one entry
per request), links added one by one. That ran in the engine core's thread between two forwards, at
about 0.35 ms a step of 8 requests (``docs/perf-log.md``). Here a span is the SDK's own finished form,
a ``ReadableSpan``, passed to the same span processors ``Span.end()`` passes it to: the same spans in
the trace file and live, at a sixth of the cost.

What the SDK would have done and this leaves to its caller:
- **valid attribute values** (str, bool, int, float, or a list of one of them; no None): the
  tracer builds them so, and ``tests/tracing/test_otlp_json.py`` holds a traced run's spans to the
  OTLP encoder, which refuses anything else;
- **sampling**: none. A trace file is the run's record, which a replay and ``traces check`` read
  whole; ``OTEL_TRACES_SAMPLER`` still samples the spans the tracers start (requests, start-up);
- **limits**: no attribute or link is dropped (the SDK keeps 128 links by default: a step of 256
  requests would lose half of its links).

Ids are the SDK's random ones; a span's context is made first (``new_trace``, ``child``), so that a
step's trace context can go to its workers while it runs, before its span exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

_UNSET = Status(StatusCode.UNSET)
# A new trace's flags, as the SDK sets them: sampled, and the trace id random (W3C trace context level 2).
_ROOT_FLAGS = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)


class FinishedSpans:
    """Finished spans of one provider (its resource, its processors), under the tracer's scope."""

    def __init__(self, resource: Resource, processors: Sequence[SpanProcessor], scope: InstrumentationScope) -> None:
        self.resource = resource
        self.processors = processors
        self.scope = scope
        self.ids = RandomIdGenerator()

    def new_trace(self) -> SpanContext:
        """The context of a new trace's root span."""
        return SpanContext(self.ids.generate_trace_id(), self.ids.generate_span_id(), False, _ROOT_FLAGS)

    def child(self, parent: SpanContext) -> SpanContext:
        """The context of a new span under ``parent``, in its trace."""
        return SpanContext(parent.trace_id, self.ids.generate_span_id(), False, parent.trace_flags, parent.trace_state)

    def emit(self, name: str, context: SpanContext, start_ns: int, end_ns: int, parent: SpanContext | None = None,
             attributes: Mapping | None = None, links: Sequence[Link] = (), status: Status = _UNSET) -> None:
        """Export the span: to each processor, as ``Span.end()`` would. ``attributes`` is the span's
        from now on: its caller does not change it afterwards (the export runs later, on another thread)."""
        span = ReadableSpan(name, context, parent, self.resource, attributes or {}, (), tuple(links),
                            status=status, start_time=start_ns, end_time=end_ns, instrumentation_scope=self.scope)
        for processor in self.processors:
            processor.on_end(span)
