"""Reading ``--trace-out`` files in tests: spans as plain dicts, attributes as Python values."""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from collections.abc import Iterable


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


def step_block_changes(spans: list[dict]) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """Per request, the block references the ``engine_step`` spans say it took (allocated and
    prefix-cache hits) and dropped, over the whole run."""
    taken: dict[str, Counter] = {}
    dropped: dict[str, Counter] = {}
    for span in spans:
        if span["name"] != "engine_step":
            continue
        a = attrs(span)
        for kind, into in (("allocated", taken), ("freed", dropped)):
            block_ids = iter(a.get(f"step.blocks_{kind}.block_ids", []))
            for req_id, n in zip(a.get(f"step.blocks_{kind}.req_ids", []), a.get(f"step.blocks_{kind}.num", [])):
                into.setdefault(req_id, Counter()).update(next(block_ids) for _ in range(n))
    return taken, dropped


def trace_dirs(root) -> list[str]:
    """Every directory under ``root`` (itself included) that holds ``tracevllm-*.jsonl`` files, each once
    (pytest links ``<test name>current`` to a test's latest tmp_path), as real paths."""
    return sorted({os.path.dirname(os.path.realpath(path))
                   for path in glob.glob(os.path.join(root, "**", "tracevllm-*.jsonl"), recursive=True)})


def assert_traces_hold_the_invariants(root, skip: Iterable = ()) -> None:
    """``tracevllm traces check`` (viz/check.py) on every trace directory under ``root``, except those
    under a ``skip`` directory: each holds every invariant of the engine (or has no steps to check),
    and ``tracevllm traces explain`` (viz/explain.py) charges every second of each request's e2e:
    its parts add up to the e2e within max(1 ms, 0.5 %)."""
    from viz.check import check_trace
    from viz.explain import explain

    skip = [os.path.join(os.path.realpath(d), "") for d in skip]
    broken = []
    for trace_dir in trace_dirs(str(root)):
        if not any(os.path.join(trace_dir, "").startswith(d) for d in skip):
            trace, violation = check_trace(trace_dir)
            if violation is not None:
                broken.append(f"{trace_dir}: {violation}")
            elif trace.steps:
                broken += [f"{trace_dir}: request {x.request_id}: parts add up to {sum(x.parts.values())} s, "
                           f"e2e {x.e2e_s} s" for x in explain(trace)
                           if abs(sum(x.parts.values()) - x.e2e_s) > max(1e-3, 0.005 * x.e2e_s)]
    assert not broken, "traces check and explain: " + "\n".join(broken)
