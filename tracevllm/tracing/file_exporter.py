"""A span exporter that appends OpenTelemetry's JSON Lines file format.

Each line is one OTLP ``ExportTraceServiceRequest`` in its JSON encoding
(``{"resourceSpans": [...]}``), the format of the OpenTelemetry Collector's file exporter: trace and
span ids as lowercase hex, enums as integers (``otlp_json.py`` builds it). A line is written whole
and flushed, so a crash can at worst lose the batch in flight, never corrupt earlier lines.

The export runs on the span processor's thread, in the engine core's process, and encoding is Python
work that holds the GIL: a batch of 512 spans is about 15 ms of it. Python hands the GIL to a thread
that waits for it only every 5 ms (``sys.getswitchinterval()``), so the engine core's thread, back from
its forward and wanting the GIL at each step, could wait up to 5 ms each time: a few per cent of a
served vLLM's throughput on 2 cores (``docs/perf-log.md``). So a batch is encoded in pieces of
``SPANS_A_LINE`` spans, one line each, with a short sleep between two pieces, which lets a waiting
thread take the GIL at once: the engine core's thread waits at most one piece (a fraction of a
millisecond). The sleeps cost the processor's thread time, and no CPU. A flush on the main thread (the
engine core's, when it goes idle; a what-if's) has nobody to make room for: it does not pause.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracevllm.tracing.otlp_json import encode_spans_json

SPANS_A_LINE = 16  # about 0.3 ms of encoding
_PAUSE_S = 1e-4  # long enough that the thread sleeps, so that a thread waiting for the GIL takes it


class JsonLinesSpanExporter(SpanExporter):
    """Appends to ``path``. One process's services share it (one span processor each): ``share()``
    counts them, and the file closes when the last one shuts down."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "ab")
        self._users = 0

    def share(self) -> "JsonLinesSpanExporter":
        with self._lock:
            self._users += 1
        return self

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for start in range(0, len(spans), SPANS_A_LINE):
            if start and threading.current_thread() is not threading.main_thread():
                time.sleep(_PAUSE_S)  # the GIL to whoever waits for it (the module docstring)
            # Compact UTF-8 JSON, in 1/7 of json.dumps's time.
            lines.append(msgspec.json.encode(encode_spans_json(spans[start:start + SPANS_A_LINE])) + b"\n")
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.writelines(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users <= 0:
                self._file.close()
