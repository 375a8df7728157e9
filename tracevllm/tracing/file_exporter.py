"""A span exporter that appends OpenTelemetry's JSON Lines file format.

Each line is one OTLP ``ExportTraceServiceRequest`` in its JSON encoding
(``{"resourceSpans": [...]}``), the format of the OpenTelemetry Collector's file exporter: trace and
span ids as lowercase hex, enums as integers. A line is written whole and flushed, so a crash can at
worst lose the batch in flight, never corrupt earlier lines.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

ID_KEYS = ("traceId", "spanId", "parentSpanId")


def ids_to_hex(document: dict) -> None:
    """Turn the ids of an ``ExportTraceServiceRequest`` dict from protobuf's base64 into hex, in
    place. Ids sit on spans and on their links only, so only those are visited (this runs on the
    export thread for every batch, beside the model's forward pass)."""
    for resource_spans in document.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for holder in (span, *span.get("links", ())):
                    for key in ID_KEYS:
                        if key in holder:
                            holder[key] = base64.b64decode(holder[key]).hex()


class JsonLinesSpanExporter(SpanExporter):
    """Appends to ``path``. One process's services share it (one span processor each): ``share()``
    counts them, and the file closes when the last one shuts down."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")
        self._users = 0

    def share(self) -> "JsonLinesSpanExporter":
        with self._lock:
            self._users += 1
        return self

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        ids_to_hex(message)
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users <= 0:
                self._file.close()
