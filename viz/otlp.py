"""Reading a ``--trace-out`` directory: every ``tracevllm-<pid>.jsonl`` file, as ``Span`` objects.

Each line is one OTLP/JSON ``ExportTraceServiceRequest`` (``{"resourceSpans": [...]}``) with hex
ids; 64-bit integers (timestamps, ``intValue``) arrive as decimal strings. A process killed while
writing leaves its last line cut short: that line is skipped with a warning, the rest loads. Any
other unreadable line is a ValueError naming the file and line.

A line is decoded by msgspec into the typed envelope below (``_Export``: resources, scopes, spans,
events), in C; each list of attributes stays the line's raw bytes (``msgspec.Raw``) until its span
is built, then is decoded on its own, also typed (``_KeyValue``, ``_AnyValue``: msgspec turns the
decimal strings into ints in C), and its values turned into Python values (``any_value``). On a
trace of 6,762 engine steps (98,724 spans) the envelope took 0.25 s of CPU against 2.4 s for
``json.loads`` of the same lines; what is left is mostly the attributes' values, in Python. Typed,
they took a quarter less than decoded as dicts (the whole loader's times are in docs/tracing.md,
"Two runs compared").
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Collection
from typing import Any

import msgspec

from tracevllm.tracing.schema import Attr
from viz.model import Process, Span, SpanEvent

FILE_PATTERN = "tracevllm-*.jsonl"
_NO_ATTRIBUTES = msgspec.Raw(b"[]")


# The envelope of a line, its fields named as in OTLP/JSON.
class _Event(msgspec.Struct):
    name: str
    timeUnixNano: int
    attributes: msgspec.Raw = _NO_ATTRIBUTES


class _Span(msgspec.Struct):
    name: str
    traceId: str
    spanId: str
    startTimeUnixNano: int
    endTimeUnixNano: int
    parentSpanId: str = ""
    attributes: msgspec.Raw = _NO_ATTRIBUTES
    events: list[_Event] = []


class _ScopeSpans(msgspec.Struct):
    spans: list[_Span] = []


class _Resource(msgspec.Struct, frozen=True):
    attributes: msgspec.Raw = _NO_ATTRIBUTES


class _ResourceSpans(msgspec.Struct):
    resource: _Resource = _Resource()
    scopeSpans: list[_ScopeSpans] = []


class _Export(msgspec.Struct):
    resourceSpans: list[_ResourceSpans]


# An attribute: one field of the AnyValue is set (none, for an empty value).
class _AnyValue(msgspec.Struct):
    stringValue: str | None = None
    intValue: int | None = None
    doubleValue: float | None = None
    boolValue: bool | None = None
    arrayValue: _ArrayValue | None = None
    kvlistValue: _KeyValueList | None = None
    bytesValue: str | None = None  # base64, kept so


class _ArrayValue(msgspec.Struct):
    values: list[_AnyValue] = []


class _KeyValue(msgspec.Struct):
    key: str
    value: _AnyValue = msgspec.field(default_factory=_AnyValue)


class _KeyValueList(msgspec.Struct):
    values: list[_KeyValue] = []


# strict=False: the timestamps' and intValues' decimal strings decode as ints, a doubleValue's "NaN",
# "Infinity" and "-Infinity" as floats.
_LINE = msgspec.json.Decoder(_Export, strict=False)
_KEY_VALUES = msgspec.json.Decoder(list[_KeyValue], strict=False)


def any_value(value: _AnyValue) -> Any:
    """An OTLP/JSON AnyValue as a Python value (an empty one, as None)."""
    if value.stringValue is not None:
        return value.stringValue
    if value.intValue is not None:
        return value.intValue
    if value.arrayValue is not None:  # mostly ints and strings: those without a call each
        return [v.intValue if v.intValue is not None else v.stringValue if v.stringValue is not None
                else any_value(v) for v in value.arrayValue.values]
    if value.doubleValue is not None:
        return value.doubleValue
    if value.boolValue is not None:
        return value.boolValue
    if value.kvlistValue is not None:
        return {kv.key: any_value(kv.value) for kv in value.kvlistValue.values}
    return value.bytesValue


def attributes(raw: msgspec.Raw) -> dict[str, Any]:
    """A list of OTLP/JSON KeyValues, still as its raw bytes, as a dict of Python values."""
    return {kv.key: any_value(kv.value) for kv in _KEY_VALUES.decode(raw)}


def _spans_of_line(line: bytes, names: Collection[str] | None) -> list[Span]:
    spans = []
    for resource_spans in _LINE.decode(line).resourceSpans:
        resource = attributes(resource_spans.resource.attributes)
        process = Process(int(resource.get("process.pid", 0)), str(resource.get(Attr.PROCESS, "")),
                          str(resource.get("service.name", "")), int(resource.get(Attr.TRACE_FORMAT, 1)))
        for scope_spans in resource_spans.scopeSpans:
            for s in scope_spans.spans:
                if names is not None and s.name not in names:
                    continue
                events = tuple(SpanEvent(e.name, e.timeUnixNano, attributes(e.attributes)) for e in s.events)
                spans.append(Span(s.name, s.traceId, s.spanId, s.parentSpanId or None, s.startTimeUnixNano,
                                  s.endTimeUnixNano, attributes(s.attributes), events, process))
    return spans


def read_file(path: str, names: Collection[str] | None = None) -> list[Span]:
    """The spans of one file (only those named ``names``, if given: the others are left undecoded)."""
    with open(path, "rb") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    spans = []
    for n, line in lines:
        try:
            spans += _spans_of_line(line, names)
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # msgspec's DecodeError is a ValueError
            if n == lines[-1][0]:
                warnings.warn(f"{path}:{n}: skipped an unreadable last line (cut short?): {e}", stacklevel=3)
            else:
                raise ValueError(f"{path}:{n}: not an OTLP/JSON trace line: {e}") from e
    return spans


def read_spans(directory: str, names: Collection[str] | None = None) -> list[Span]:
    """Every span of every trace file in ``directory`` (only those named ``names``, if given);
    ValueError if there is none."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: no such trace directory")
    paths = sorted(glob.glob(os.path.join(directory, FILE_PATTERN)))
    if not paths:
        raise ValueError(f"{directory}: no trace files ({FILE_PATTERN}); record some with --trace-out {directory}")
    spans = [span for path in paths for span in read_file(path, names)]
    if not spans:
        raise ValueError(f"{directory}: the trace files hold no spans")
    return spans
