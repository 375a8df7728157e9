"""The trace files' encoder (tracing/otlp_json.py) against OpenTelemetry's own: protobuf encoding by
``encode_spans``, JSON by protobuf's ``MessageToDict``, ids turned to hex. Field for field the same,
on every span of a traced run and on spans carrying every kind of attribute value."""

from __future__ import annotations

import math

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace import set_span_in_context

from tracevllm import LLM, SamplingParams
from tracevllm.tracing import file_exporter
from tracevllm.tracing.otlp_json import encode_spans_json
from viz.export import ids_to_hex


def library_encoding(spans) -> dict:
    document = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    ids_to_hex(document)
    return document


def same(a, b) -> bool:
    """Equal, with NaN equal to NaN (a float attribute may be one)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def test_every_kind_of_value_encodes_as_the_library_encodes_it():
    keep = Keep()
    provider = TracerProvider(resource=Resource.create({"service.name": "t", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("scope", "1.2", schema_url="https://opentelemetry.io/schemas/1.30.0")
    bare_provider = TracerProvider(resource=Resource({}))
    bare_provider.add_span_processor(SimpleSpanProcessor(keep))
    bare = bare_provider.get_tracer("bare")
    remote = SpanContext(0x5B8EFFF798038103D269B633813FC60C, 0x00F067AA0BA902B7, is_remote=True,
                         trace_flags=TraceFlags(1))
    values = {"s": "text", "empty": "", "t": True, "f": False, "zero": 0, "neg": -7, "big": 2 ** 62, "x": 1.5,
              "whole": 2.0, "nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "tiny": 1e-300,
              "strs": ["a", ""], "ints": [0, 1, -2], "floats": (0.1, 3.0), "bools": [False, True], "none": []}
    with tracer.start_as_current_span("parent", kind=SpanKind.SERVER, attributes=values) as parent:
        parent.add_event("EVENT", {"k": 1}, timestamp=123)
        parent.add_event("BARE")
        with tracer.start_as_current_span("child", links=[Link(remote, {"why": "link"}), Link(remote)]) as child:
            child.set_status(Status(StatusCode.ERROR, "went wrong"))
    with tracer.start_as_current_span("remote child", context=set_span_in_context(NonRecordingSpan(remote)),
                                      kind=SpanKind.CLIENT) as span:
        span.set_status(Status(StatusCode.OK))
    with bare.start_as_current_span(""):
        pass
    assert len(keep.spans) == 4
    assert same(encode_spans_json(keep.spans), library_encoding(keep.spans))
    assert encode_spans_json([]) == library_encoding([]) == {}


def test_a_traced_runs_spans_encode_as_the_library_encodes_them(tiny_checkpoint, tmp_path, monkeypatch):
    """Every batch the file exporter writes in a run with preemption, prefix hits and text."""
    batches = []

    def both(spans):
        batches.append((encode_spans_json(spans), library_encoding(spans)))
        return batches[-1][0]

    monkeypatch.setattr(file_exporter, "encode_spans_json", both)
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", block_size=4, num_gpu_blocks_override=17, max_model_len=64,
              trace_out=str(tmp_path), trace_include_text=True)
    prompts = ["The same long opening of a prompt, then request number %d." % i for i in range(4)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    llm.llm_engine.shutdown()
    assert sum(len(s["spans"]) for ours, _ in batches for r in ours["resourceSpans"] for s in r["scopeSpans"]) > 50
    for ours, theirs in batches:
        assert same(ours, theirs)
