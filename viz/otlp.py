"""Reading a ``--trace-out`` directory: every ``tracevllm-<pid>.jsonl`` file, as ``Span`` objects.

Each line is one OTLP/JSON ``ExportTraceServiceRequest`` (``{"resourceSpans": [...]}``) with hex
ids; 64-bit integers (timestamps, ``intValue``) arrive as decimal strings. A process killed while
writing leaves its last line cut short: that line is skipped with a warning, the rest loads. Any
other unreadable line is a ValueError naming the file and line.
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from typing import Any

from tracevllm.tracing.schema import Attr
from viz.model import Process, Span, SpanEvent

FILE_PATTERN = "tracevllm-*.jsonl"


def any_value(value: dict) -> Any:
    """An OTLP/JSON AnyValue as a Python value (an empty one, as None)."""
    if not value:
        return None
    (kind, inner), = value.items()
    if kind == "intValue":
        return int(inner)
    if kind == "arrayValue":
        return [any_value(v) for v in inner.get("values", [])]
    if kind == "kvlistValue":
        return key_values(inner.get("values", []))
    return inner


def key_values(items: list[dict]) -> dict[str, Any]:
    return {kv["key"]: any_value(kv.get("value", {})) for kv in items}


def attributes(obj: dict) -> dict[str, Any]:
    return key_values(obj.get("attributes", []))


def _spans_of_line(document: dict) -> list[Span]:
    spans = []
    for resource_spans in document["resourceSpans"]:
        resource = attributes(resource_spans.get("resource", {}))
        process = Process(int(resource.get("process.pid", 0)), str(resource.get(Attr.PROCESS, "")),
                          str(resource.get("service.name", "")), int(resource.get(Attr.TRACE_FORMAT, 1)))
        for scope_spans in resource_spans.get("scopeSpans", []):
            for s in scope_spans.get("spans", []):
                events = tuple(SpanEvent(e["name"], int(e["timeUnixNano"]), attributes(e))
                               for e in s.get("events", []))
                spans.append(Span(s["name"], s["traceId"], s["spanId"], s.get("parentSpanId") or None,
                                  int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]), attributes(s),
                                  events, process))
    return spans


def read_file(path: str) -> list[Span]:
    with open(path, encoding="utf-8") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    spans = []
    for n, line in lines:
        try:
            spans += _spans_of_line(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if n == lines[-1][0]:
                warnings.warn(f"{path}:{n}: skipped an unreadable last line (cut short?): {e}", stacklevel=3)
            else:
                raise ValueError(f"{path}:{n}: not an OTLP/JSON trace line: {e}") from e
    return spans


def read_spans(directory: str) -> list[Span]:
    """Every span of every trace file in ``directory``; ValueError if there is none."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such trace directory")
    paths = sorted(glob.glob(os.path.join(directory, FILE_PATTERN)))
    if not paths:
        raise ValueError(f"{directory}: no trace files ({FILE_PATTERN}); record some with --trace-out {directory}")
    spans = [span for path in paths for span in read_file(path)]
    if not spans:
        raise ValueError(f"{directory}: the trace files hold no spans")
    return spans
