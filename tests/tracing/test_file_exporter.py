"""The trace file's exporter (tracing/file_exporter.py): a batch in pieces, every span once, in order."""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tracevllm.tracing.file_exporter import SPANS_A_LINE, JsonLinesSpanExporter


class Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def test_a_batch_is_written_in_pieces_of_a_line_each(tmp_path):
    keep = Keep()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("tracevllm")
    for i in range(2 * SPANS_A_LINE + 3):
        tracer.start_span(f"span {i}").end()
    exporter = JsonLinesSpanExporter(str(tmp_path / "t.jsonl")).share()
    assert exporter.export(keep.spans) == SpanExportResult.SUCCESS
    exporter.shutdown()
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    names = [[s["name"] for r in json.loads(line)["resourceSpans"] for scope in r["scopeSpans"] for s in scope["spans"]]
             for line in lines]
    assert [len(n) for n in names] == [SPANS_A_LINE, SPANS_A_LINE, 3]
    assert sum(names, []) == [f"span {i}" for i in range(2 * SPANS_A_LINE + 3)]
    assert exporter.export(keep.spans[:1]) == SpanExportResult.FAILURE  # closed: nothing written after
