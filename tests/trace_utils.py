"""Reading ``--trace-out`` files in tests: spans as plain dicts, attributes as Python values."""

from __future__ import annotations

import json
import os
from collections import Counter


def value(v: dict):
    """An OTLP/JSON AnyValue as a Python value (ints arrive as strings in protobuf's JSON)."""
    (kind, inner), = v.items()
    if kind == "intValue":
        return int(inner)
    if kind == "arrayValue":
        return [value(x) for x in inner.get("values", [])]
    return inner


def attrs(obj: dict) -> dict:
    return {a["key"]: value(a["value"]) for a in obj.get("attributes", [])}


def load_spans(trace_dir) -> list[dict]:
    """Every span of every file, with ``resource`` (its resource's attributes) added."""
    spans = []
    for name in sorted(os.listdir(trace_dir)):
        with open(os.path.join(trace_dir, name)) as f:
            for line in f:
                for rs in json.loads(line)["resourceSpans"]:
                    resource = attrs(rs["resource"])
                    spans += [{**span, "resource": resource} for ss in rs["scopeSpans"] for span in ss["spans"]]
    return spans


def block_events(span: dict) -> tuple[Counter, Counter]:
    """A ``scheduler.request`` span's block references: (taken: allocated and prefix-cache hits, dropped)."""
    taken, dropped = Counter(), Counter()
    for event in span.get("events", []):
        ids = attrs(event).get("block_ids", [])
        if event["name"] in ("kv.blocks_allocated", "kv.prefix_cache_hit"):
            taken.update(ids)
        elif event["name"] == "kv.blocks_freed":
            dropped.update(ids)
    return taken, dropped
