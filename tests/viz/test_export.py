"""``viz.export`` on trace files recorded by ``JsonLinesSpanExporter`` without the engine,
and ``tests/otlp_receiver.py`` against the OpenTelemetry SDK's own OTLP exporters."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
import requests
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tests.otlp_receiver import OtlpReceiver, attributes
from tests.server_utils import free_port
from tracevllm.entrypoints.cli import main
from tracevllm.tracing.file_exporter import JsonLinesSpanExporter
from viz.export import load_export_requests, push, to_otlp_document

ROOT_ATTRIBUTES = {"gen_ai.request.id": "req-0", "gen_ai.request.max_tokens": 16, "gen_ai.request.top_p": 0.9,
                   "stream": True, "gen_ai.response.finish_reasons": ("stop",), "token_ids": (1, 2, 3)}


def _provider(trace_dir, service: str, pid: int, batch: bool) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider writing ``tracevllm-<pid>.jsonl`` (one line per span, or per batch) and keeping
    the SDK spans in memory to compare with."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    to_file = JsonLinesSpanExporter(str(trace_dir / f"tracevllm-{pid}.jsonl"))
    provider.add_span_processor(BatchSpanProcessor(to_file) if batch else SimpleSpanProcessor(to_file))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[str, dict[str, ReadableSpan]]:
    """Two processes' trace files (engine: batched lines; api server: a line per span) and the SDK
    spans they hold, by hex span id."""
    trace_dir = tmp_path_factory.mktemp("traces")
    engine, engine_spans = _provider(trace_dir, "tracevllm-engine", 101, batch=True)
    api, api_spans = _provider(trace_dir, "tracevllm-api", 102, batch=False)

    tracer = engine.get_tracer("tracevllm.engine")
    with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER, attributes=ROOT_ATTRIBUTES) as root:
        with tracer.start_as_current_span("prefill", attributes={"num_tokens": 7}) as prefill:
            prefill.add_event("first_token", {"token_id": 42, "logprob": -0.5})
        with tracer.start_as_current_span("decode") as decode:
            decode.set_status(Status(StatusCode.ERROR, "stopped early"))
    api.get_tracer("tracevllm.api").start_span(
        "POST /v1/completions", kind=SpanKind.SERVER, links=[Link(root.get_span_context(), {"why": "request"})],
    ).end()
    for provider in (engine, api):
        provider.shutdown()

    spans = list(engine_spans.get_finished_spans()) + list(api_spans.get_finished_spans())
    return str(trace_dir), {format(s.context.span_id, "016x"): s for s in spans}


def _loaded_spans(trace_dir: str) -> dict[str, tuple[dict, Span]]:
    """Loaded spans by hex span id, each with its resource's attributes."""
    return {
        span.span_id.hex(): (attributes(rs.resource.attributes), span)
        for request in load_export_requests([trace_dir])
        for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    }


def test_load_round_trips_every_field(recorded):
    trace_dir, originals = recorded
    loaded = _loaded_spans(trace_dir)
    assert loaded.keys() == originals.keys() and len(loaded) == 4
    for span_id, original in originals.items():
        resource, span = loaded[span_id]
        assert resource["service.name"] == original.resource.attributes["service.name"]
        assert span.name == original.name
        assert span.trace_id.hex() == format(original.context.trace_id, "032x")
        parent = format(original.parent.span_id, "016x") if original.parent else ""
        assert span.parent_span_id.hex() == parent
        assert span.kind == original.kind.value + 1  # OTLP's enum counts SPAN_KIND_UNSPECIFIED as 0
        assert (span.start_time_unix_nano, span.end_time_unix_nano) == (original.start_time, original.end_time)
        assert attributes(span.attributes) == {k: list(v) if isinstance(v, tuple) else v
                                               for k, v in original.attributes.items()}
        assert [(e.name, e.time_unix_nano, attributes(e.attributes)) for e in span.events] == [
            (e.name, e.timestamp, dict(e.attributes)) for e in original.events]
        assert [(k.trace_id.hex(), k.span_id.hex(), attributes(k.attributes)) for k in span.links] == [
            (format(k.context.trace_id, "032x"), format(k.context.span_id, "016x"), dict(k.attributes))
            for k in original.links]
    assert [s.status.message for _, s in loaded.values() if s.status.code == 2] == ["stopped early"]


@pytest.mark.broken_traces
def test_load_names_the_corrupt_file_and_line(recorded, tmp_path):
    trace_dir, _ = recorded
    bad = tmp_path / "tracevllm-7.jsonl"
    shutil.copy(f"{trace_dir}/tracevllm-102.jsonl", bad)
    lines = bad.read_text().count("\n")
    with bad.open("a") as f:
        f.write('{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "not hex"}]}]}]}\n')
    with pytest.raises(ValueError, match=f"tracevllm-7.jsonl:{lines + 1}: "):
        load_export_requests([str(tmp_path)])
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="tracevllm-7.jsonl:1: "):
        load_export_requests([str(bad)])
    with pytest.raises(ValueError, match="no such trace file"):
        load_export_requests([str(tmp_path / "missing")])


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_push_delivers_every_span(recorded, protocol):
    trace_dir, originals = recorded
    with OtlpReceiver() as rx:
        endpoint = rx.http_endpoint + "/v1/traces" if protocol == "http/protobuf" else rx.grpc_endpoint
        assert push(load_export_requests([trace_dir]), endpoint, protocol, headers={"X-Tenant": "t"}) == 4
        received = {span.span_id.hex(): (resource, span) for resource, span in rx.spans()}
    assert received.keys() == originals.keys()
    assert {span.trace_id.hex() for _, span in received.values()} == {
        format(s.context.trace_id, "032x") for s in originals.values()}
    assert {r["service.name"] for r, _ in received.values()} == {"tracevllm-engine", "tracevllm-api"}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_push_raises_on_refusal_or_no_receiver(recorded, protocol):
    batches = load_export_requests([recorded[0]])
    with OtlpReceiver() as rx:
        rx.reject = True
        endpoint = rx.http_endpoint if protocol == "http/protobuf" else rx.grpc_endpoint
        with pytest.raises(RuntimeError, match="HTTP 500" if protocol == "http/protobuf" else "gRPC INTERNAL"):
            push(batches, endpoint, protocol)
    port = free_port()
    with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"):
        push(batches, f"http://127.0.0.1:{port}", protocol, timeout=2.0)


def _hex_ids_to_base64(obj: object) -> None:
    """An oracle independent of viz/export.py: OTLP/JSON's hex ids to protobuf JSON's base64."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("traceId", "spanId", "parentSpanId"):
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                _hex_ids_to_base64(value)
    elif isinstance(obj, list):
        for value in obj:
            _hex_ids_to_base64(value)


def test_otlp_document_is_otlp_json(recorded):
    batches = load_export_requests([recorded[0]])
    document = to_otlp_document(batches)
    spans = [s for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(document["resourceSpans"]) == len(batches) and len(spans) == 4
    for span in spans:
        assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16
        assert set(span["traceId"] + span["spanId"]) <= set("0123456789abcdef")
        assert isinstance(span["kind"], int)
        assert span["startTimeUnixNano"].isdecimal() and span["endTimeUnixNano"].isdecimal()
        assert all(e["timeUnixNano"].isdecimal() for e in span.get("events", []))
        assert all(len(k["traceId"]) == 32 and len(k["spanId"]) == 16 for k in span.get("links", []))
    assert sum("parentSpanId" in s for s in spans) == 2

    _hex_ids_to_base64(document)
    parsed = ParseDict(document, ExportTraceServiceRequest())
    assert list(parsed.resource_spans) == [rs for request in batches for rs in request.resource_spans]


def _cli(argv: list[str]) -> int:
    """The real ``tracevllm`` command line."""
    return main(argv)


def test_cli_writes_jaeger_file_and_pushes(recorded, tmp_path, capsys):
    trace_dir, originals = recorded
    jaeger = tmp_path / "jaeger.json"
    assert _cli(["traces", "jaeger", trace_dir, "-o", str(jaeger)]) == 0  # Jaeger's JSON model by default
    traces = json.loads(jaeger.read_text())["data"]
    assert sorted(s["spanID"] for t in traces for s in t["spans"]) == sorted(originals)
    assert capsys.readouterr().out == f"wrote 4 spans from 2 files to {jaeger}\n"
    out = tmp_path / "otlp.json"
    assert _cli(["traces", "jaeger", trace_dir, "-o", str(out), "--format", "otlp"]) == 0
    assert len(json.loads(out.read_text())["resourceSpans"]) == len(load_export_requests([trace_dir]))
    assert capsys.readouterr().out == f"wrote 4 spans from 2 files to {out}\n"

    with OtlpReceiver() as rx:
        assert _cli(["traces", "push", trace_dir, "--endpoint", rx.grpc_endpoint, "--protocol", "grpc",
                     "--header", "authorization=Bearer x"]) == 0
        assert len(rx.spans()) == 4
        # The merged file is OTLP/JSON a receiver accepts as is.
        answer = requests.post(f"{rx.http_endpoint}/v1/traces", data=out.read_bytes(),
                               headers={"Content-Type": "application/json"}, timeout=5)
        assert answer.status_code == 200 and len(rx.spans()) == 8
    assert capsys.readouterr().out == f"pushed 4 spans from 2 files to {rx.grpc_endpoint}\n"
    assert _cli(["traces", "push", trace_dir, "--endpoint", "http://x", "--header", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_receiver_takes_the_sdk_exporters(protocol):
    with OtlpReceiver() as rx:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=rx.grpc_endpoint, insecure=True)
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces")
        provider = TracerProvider(resource=Resource.create({"service.name": "sdk-test"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with provider.get_tracer("t").start_as_current_span("outer", attributes={"n": 3, "ok": True}):
            provider.get_tracer("t").start_span("inner", attributes={"tags": ["a", "b"]}).end()
        provider.shutdown()
        rx.wait_for(lambda rx: len(rx.spans()) == 2)
        spans = {span.name: (resource, attributes(span.attributes)) for resource, span in rx.spans()}
    assert spans["outer"][1] == {"n": 3, "ok": True}
    assert spans["inner"][1] == {"tags": ["a", "b"]}
    assert {resource["service.name"] for resource, _ in spans.values()} == {"sdk-test"}
