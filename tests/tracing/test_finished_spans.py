"""Spans made whole (tracing/finished_spans.py) against the same spans made by the SDK's tracer: the
exporters see the same fields, and the library's OTLP encoder takes them."""

from __future__ import annotations

import json

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, Status, StatusCode, set_span_in_context

from tracevllm.config import ObservabilityConfig
from tracevllm.tracing.finished_spans import FinishedSpans
from tracevllm.tracing.otel import flush_traces, init_finished_spans, init_tracer
from tracevllm.tracing.schema import Service
from tests.tracing.test_otlp_json import Keep
from tracevllm.tracing.otlp_json import encode_spans_json


def fields(span) -> tuple:
    """What an exporter reads of a span, less its ids (the SDK keeps a list attribute as a tuple)."""
    attributes = {k: tuple(v) if isinstance(v, list) else v for k, v in (span.attributes or {}).items()}
    return (span.name, span.kind, span.start_time, span.end_time, attributes,
            [(link.context, dict(link.attributes or {})) for link in span.links], span.status.status_code,
            span.status.description, span.resource, span.instrumentation_scope, span.parent is None)


def test_a_step_made_whole_is_the_step_the_tracer_makes():
    keep = Keep()
    processor = SimpleSpanProcessor(keep)
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}))
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("tracevllm")
    request = tracer.start_span("scheduler.request")
    attributes = {"step.number": 3, "step.req_ids": ["a", 'b "quoted"'], "step.req_num_tokens": [16, 1],
                  "step.req_is_decode": [False, True], "step.kv_cache_usage": 0.25, "step.blocks_evicted": []}
    links = [Link(request.get_span_context())]

    step = tracer.start_span("engine_step", start_time=10)
    step.set_attributes(attributes)
    step.add_link(request.get_span_context())
    tracer.start_span("schedule", context=set_span_in_context(step), start_time=10).end(end_time=12)
    step.set_status(Status(StatusCode.ERROR, "boom"))
    step.end(end_time=20)
    by_tracer = list(keep.spans)
    keep.spans.clear()

    spans = FinishedSpans(provider.resource, [processor], InstrumentationScope("tracevllm", "", ""))
    context = spans.new_trace()
    child = spans.child(context)
    spans.emit("schedule", child, 10, 12, context)
    spans.emit("engine_step", context, 10, 20, attributes=attributes, links=links,
               status=Status(StatusCode.ERROR, "boom"))
    made_whole = list(keep.spans)

    assert [fields(s) for s in made_whole] == [fields(s) for s in by_tracer]
    assert child.trace_id == context.trace_id and made_whole[0].parent == context
    assert context.trace_flags.sampled and context.trace_id != spans.new_trace().trace_id
    encode_spans(made_whole)  # the library's encoder takes them (it refuses a value of another type)
    assert encode_spans_json(made_whole)


def test_no_link_is_dropped():
    """The SDK keeps 128 links a span by default: a step of 256 requests links to all 256 here."""
    keep = Keep()
    processor = SimpleSpanProcessor(keep)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    requests = [provider.get_tracer("tracevllm").start_span("r") for _ in range(256)]
    spans = FinishedSpans(provider.resource, [processor], InstrumentationScope("tracevllm", "", ""))
    spans.emit("engine_step", spans.new_trace(), 1, 2, links=[Link(r.get_span_context()) for r in requests])
    assert len(keep.spans[0].links) == 256 and keep.spans[0].dropped_links == 0


def test_a_trace_file_has_both_kinds_of_span_under_one_scope(tmp_path):
    config = ObservabilityConfig(trace_out=str(tmp_path), trace_level="step")
    tracer, spans = init_tracer(config, Service.ENGINE_CORE), init_finished_spans(config, Service.ENGINE_CORE)
    tracer.start_span("started").end()
    spans.emit("made whole", spans.new_trace(), 1, 2)
    flush_traces()
    (path,) = tmp_path.glob("*.jsonl")
    documents = [json.loads(line) for line in path.read_text().splitlines()]
    scopes = [scope for d in documents for r in d["resourceSpans"] for scope in r["scopeSpans"]]
    assert [s["name"] for scope in scopes for s in scope["spans"]] == ["started", "made whole"]
    assert len(scopes) == 1 and scopes[0]["scope"] == {"name": "tracevllm"}
