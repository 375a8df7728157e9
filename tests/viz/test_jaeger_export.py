"""``viz.jaeger``: OTLP traces as Jaeger's own JSON model (``/api/traces``), on OTLP/JSON
written by hand here and on traces the engine recorded; and ``tracevllm traces jaeger`` in both formats."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from tracevllm.entrypoints.cli import main
from viz import jaeger
from viz.jaeger import to_jaeger_traces
from viz.export import from_otlp_json, load_export_requests, to_otlp_document

T1 = "5b8efff798038103d269b633813fc60c"
T2 = "0000000000000000000000000000abcd"  # high half zero: Jaeger writes 16 hex digits
ROOT, CHILD, REMOTE = "eee19b7ec3c1b174", "00f067aa0ba902b7", "53995c3f42cd8ad8"
BARE, OTHER = "1111111111111111", "2222222222222222"
T0 = 1_700_000_000_123_456_789  # ns


def _value(v: object) -> dict:
    """A Python value as an OTLP/JSON AnyValue."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, bytes):
        return {"bytesValue": base64.b64encode(v).decode()}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": _attrs(v)}}
    return {"stringValue": v}


def _attrs(d: dict) -> list[dict]:
    return [{"key": k, "value": _value(v)} for k, v in d.items()]


def _span(trace_id: str, span_id: str, name: str, start: int, end: int, parent: str = "", **fields) -> dict:
    span = {"traceId": trace_id, "spanId": span_id, "name": name,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end), **fields}
    return {**span, "parentSpanId": parent} if parent else span


ROOT_ATTRIBUTES = {"n": 7, "big": 2**60, "ok": True, "p": 0.9, "s": "text", "ids": [1, 2, 3],
                   "mixed": ["<a>", 1.0, 2.5e-7, False], "map": {"z": 1, "a": "b"}, "raw": b"\x00\xff"}


def _documents() -> list[dict]:
    """Two export requests (two files' lines) from two services, holding two traces."""
    engine = {"attributes": _attrs({"service.name": "engine", "process.pid": 101})}
    api = {"attributes": _attrs({"service.name": "api", "process.pid": 102})}
    scope = {"name": "tracevllm.engine", "version": "1.2"}
    root = _span(T1, ROOT, "llm_request", T0, T0 + 5_000_999, kind=2, attributes=_attrs(ROOT_ATTRIBUTES),
                 status={"code": 1}, flags=0x301)
    child = _span(T1, CHILD, "prefill", T0 + 1_500, T0 + 2_001_500, parent=ROOT, kind=1, traceState="k=v",
                  status={"code": 2, "message": "stopped early"}, flags=0x100,
                  events=[{"timeUnixNano": str(T0 + 1_999), "name": "first_token",
                           "attributes": _attrs({"token_id": 42, "logprob": -0.5})},
                          {"timeUnixNano": str(T0 + 2_999), "name": "ignored",
                           "attributes": _attrs({"event": "mine"})}])
    remote = _span(T1, REMOTE, "POST /v1/completions", T0 + 10, T0 + 20, parent=ROOT, kind=3,
                   links=[{"traceId": T2, "spanId": OTHER, "attributes": _attrs({"why": "batch"})},
                          {"traceId": T2, "spanId": BARE, "attributes": _attrs({"opentracing.ref_type": "child_of"})},
                          {"traceId": T1, "spanId": ROOT}])  # a link to the parent: FOLLOWS_FROM, not a new reference
    bare = _span(T2, BARE, "engine_step", T0, T0 + 999)  # kind unspecified, no status, no scope
    other = _span(T2, OTHER, "schedule", T0 + 1, T0 + 2, parent=BARE, kind=4)
    first = {"resourceSpans": [{"resource": engine, "scopeSpans": [{"scope": scope, "spans": [root, child]}]},
                               {"resource": engine, "scopeSpans": [{"spans": [bare]}]}]}
    second = {"resourceSpans": [{"resource": api, "scopeSpans": [{"scope": {"name": "tracevllm.api"},
                                                                   "spans": [remote]}]},
                                {"resource": engine, "scopeSpans": [{"spans": [other]}]},
                                {"resource": {}, "scopeSpans": [{"spans": [_span(T2, "3" * 16, "x", T0, T0, parent=BARE,
                                                                                 kind=5)]}]}]}
    return [first, second]


@pytest.fixture(scope="module")
def converted() -> dict:
    return to_jaeger_traces([from_otlp_json(d) for d in _documents()])


def _ui_accepts(response: dict) -> bool:
    """The checks of the Jaeger UI's file loader (jaeger-ui ``readJsonFile``: ``validateSingleTrace``)."""
    return all(
        trace["traceID"] and isinstance(trace["spans"], list) and isinstance(trace["processes"], dict)
        and all(p["serviceName"] and isinstance(p["serviceName"], str) for p in trace["processes"].values())
        and all(s["traceID"] and s["spanID"] and s["operationName"] and type(s["startTime"]) is int
                and type(s["duration"]) is int and s["processID"] in trace["processes"] for s in trace["spans"])
        for trace in response["data"])


def _spans(trace: dict) -> dict[str, dict]:
    return {span["spanID"]: span for span in trace["spans"]}


def _tags(span_or_process: dict) -> dict[str, tuple[str, object]]:
    return {tag["key"]: (tag["type"], tag["value"]) for tag in span_or_process["tags"]}


def test_response_shape_one_entry_per_trace(converted):
    assert {k: v for k, v in converted.items() if k != "data"} == {"total": 0, "limit": 0, "offset": 0, "errors": None}
    assert [trace["traceID"] for trace in converted["data"]] == [T1, T2[16:]]
    assert [len(trace["spans"]) for trace in converted["data"]] == [3, 3]
    for trace in converted["data"]:
        assert trace["warnings"] is None
        for span in trace["spans"]:
            assert list(span) == ["traceID", "spanID", "flags", "operationName", "references", "startTime",
                                  "duration", "tags", "logs", "processID", "warnings"]
            assert span["traceID"] == trace["traceID"] and len(span["spanID"]) == 16 and span["warnings"] is None
    json.dumps(converted, allow_nan=False)  # plain JSON a browser parses
    assert _ui_accepts(converted)


def test_a_whole_span(converted):
    child = _spans(converted["data"][0])[CHILD]
    assert child == {
        "traceID": T1, "spanID": CHILD, "flags": 0, "operationName": "prefill",
        "references": [{"refType": "CHILD_OF", "traceID": T1, "spanID": ROOT}],
        "startTime": (T0 + 1_500) // 1000, "duration": 2_000_000 // 1000,
        "tags": [{"key": "otel.scope.name", "type": "string", "value": "tracevllm.engine"},
                 {"key": "otel.scope.version", "type": "string", "value": "1.2"},
                 {"key": "span.kind", "type": "string", "value": "internal"},
                 {"key": "otel.status_code", "type": "string", "value": "ERROR"},
                 {"key": "error", "type": "bool", "value": True},
                 {"key": "otel.status_description", "type": "string", "value": "stopped early"},
                 {"key": "w3c.tracestate", "type": "string", "value": "k=v"}],
        "logs": [{"timestamp": (T0 + 1_999) // 1000,
                  "fields": [{"key": "event", "type": "string", "value": "first_token"},
                             {"key": "token_id", "type": "int64", "value": 42},
                             {"key": "logprob", "type": "float64", "value": -0.5}]},
                 {"timestamp": (T0 + 2_999) // 1000, "fields": [{"key": "event", "type": "string", "value": "mine"}]}],
        "processID": "p1", "warnings": None,
    }


def test_times_are_microseconds(converted):
    originals = {s["spanId"]: s for d in _documents() for rs in d["resourceSpans"]
                 for ss in rs["scopeSpans"] for s in ss["spans"]}
    for trace in converted["data"]:
        for span in trace["spans"]:
            start, end = (int(originals[span["spanID"]][k]) for k in ("startTimeUnixNano", "endTimeUnixNano"))
            assert (span["startTime"], span["duration"]) == (start // 1000, (end - start) // 1000)
            assert all(isinstance(span[k], int) for k in ("startTime", "duration"))
    root = _spans(converted["data"][0])[ROOT]
    assert (root["startTime"], root["duration"]) == (1_700_000_000_123_456, 5_000)  # duration from the ns difference


def test_tags_are_typed(converted):
    tags = _tags(_spans(converted["data"][0])[ROOT])
    assert tags == {
        "otel.scope.name": ("string", "tracevllm.engine"), "otel.scope.version": ("string", "1.2"),
        "n": ("int64", 7), "big": ("int64", str(2**60)),  # beyond JavaScript's safe integers: a string
        "ok": ("bool", True), "p": ("float64", 0.9), "s": ("string", "text"),
        "ids": ("string", "[1,2,3]"), "mixed": ("string", '["\\u003ca\\u003e",1,2.5e-7,false]'),  # Go's json.Marshal
        "map": ("string", '{"a":"b","z":1}'), "raw": ("binary", base64.b64encode(b"\x00\xff").decode()),
        "span.kind": ("string", "server"), "otel.status_code": ("string", "OK"),
    }
    assert type(tags["n"][1]) is int and type(tags["ok"][1]) is bool and type(tags["p"][1]) is float
    assert json.loads(tags["mixed"][1]) == ["<a>", 1, 2.5e-7, False]


def test_kind_and_status_tags(converted):
    spans = {**_spans(converted["data"][0]), **_spans(converted["data"][1])}
    kinds = {span_id: _tags(span).get("span.kind", (None, None))[1] for span_id, span in spans.items()}
    assert kinds == {ROOT: "server", CHILD: "internal", REMOTE: "client", BARE: None, OTHER: "producer",
                     "3" * 16: "consumer"}  # SPAN_KIND_UNSPECIFIED: no tag
    for span_id in (REMOTE, BARE, OTHER):  # STATUS_CODE_UNSET: no status tags
        assert not {"otel.status_code", "error", "otel.status_description"} & _tags(spans[span_id]).keys()
    assert [_tags(spans[BARE]).keys(), _tags(spans[OTHER]).keys()] == [set(), {"span.kind"}]  # no scope name
    assert spans[ROOT]["flags"] == 1 and spans[CHILD]["flags"] == 0  # the W3C sampled bit of OTLP's flags


def test_references_parents_and_links(converted):
    first, second = converted["data"]
    assert _spans(first)[ROOT]["references"] == [] and _spans(second)[BARE]["references"] == []
    assert _spans(first)[REMOTE]["references"] == [
        {"refType": "FOLLOWS_FROM", "traceID": T1, "spanID": ROOT},  # the parent, retyped by the link to it
        {"refType": "FOLLOWS_FROM", "traceID": T2[16:], "spanID": OTHER},  # link attributes are not kept
        {"refType": "CHILD_OF", "traceID": T2[16:], "spanID": BARE},  # opentracing.ref_type=child_of
    ]
    assert "why" not in json.dumps(converted)
    for trace in converted["data"]:
        ids = _spans(trace)
        for span in trace["spans"]:
            parents = [r for r in span["references"] if r["traceID"] == trace["traceID"]]
            assert all(r["spanID"] in ids for r in parents)


def test_one_process_per_service(converted):
    first, second = converted["data"]
    assert first["processes"] == {
        "p1": {"serviceName": "engine", "tags": [{"key": "process.pid", "type": "int64", "value": 101}]},
        "p2": {"serviceName": "api", "tags": [{"key": "process.pid", "type": "int64", "value": 102}]},
    }
    assert {s["spanID"]: s["processID"] for s in first["spans"]} == {ROOT: "p1", CHILD: "p1", REMOTE: "p2"}
    # Per trace: the engine's two resources in two requests are one process; no attributes, no service.
    assert second["processes"] == {"p1": first["processes"]["p1"],
                                   "p2": {"serviceName": "OTLPResourceNoServiceName", "tags": []}}
    assert [s["processID"] for s in second["spans"]] == ["p1", "p1", "p2"]


def test_go_json_of_arrays_and_maps():
    assert jaeger._go_json([1.0, 1e21, 1e-7, 1e16, -0.0, 0.5, "é\u2028&", None, {"b": [], "a": {}}]) == (
        '[1,1e+21,1e-7,10000000000000000,-0,0.5,"é\\u2028\\u0026",null,{"a":{},"b":[]}]')
    nan = from_otlp_json({"resourceSpans": [{"scopeSpans": [{"spans": [_span(T1, ROOT, "x", 0, 0, attributes=[
        {"key": "a", "value": {"arrayValue": {"values": [{"doubleValue": "NaN"}]}}},
        {"key": "f", "value": {"doubleValue": "Infinity"}}, {"key": "e", "value": {}}])]}]}]})
    tags = _tags(to_jaeger_traces([nan])["data"][0]["spans"][0])
    assert tags == {"a": ("string", ""), "f": ("float64", "inf"), "e": ("string", "")}


def test_module_loads_without_torch_or_the_engine():
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('j', sys.argv[1]); "
            "spec.loader.exec_module(importlib.util.module_from_spec(spec)); "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('tracevllm')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, jaeger.__file__], check=True, timeout=60)


@pytest.mark.broken_traces
def test_cli_writes_both_formats(tmp_path, capsys):
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    for i, document in enumerate(_documents()):
        (trace_dir / f"tracevllm-{i}.jsonl").write_text(json.dumps(document) + "\n")
    requests = load_export_requests([str(trace_dir)])

    out = tmp_path / "trace.json"
    assert main(["traces", "jaeger", str(trace_dir), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == to_jaeger_traces(requests)
    assert capsys.readouterr().out == f"wrote 6 spans from 2 files to {out}\n"

    otlp = tmp_path / "otlp.json"
    assert main(["traces", "jaeger", str(trace_dir), "-o", str(otlp), "--format", "otlp"]) == 0
    assert json.loads(otlp.read_text()) == to_otlp_document(requests)
    assert len(json.loads(otlp.read_text())["resourceSpans"]) == 5
    with pytest.raises(SystemExit):
        main(["traces", "jaeger", str(trace_dir), "-o", str(otlp), "--format", "zipkin"])


# The real engine's traces: only generic structure, the span names and attributes may change.

@pytest.fixture(scope="module")
def engine_traces(tiny_checkpoint, tmp_path_factory) -> str:
    from tracevllm import LLM, SamplingParams

    trace_dir = tmp_path_factory.mktemp("engine-traces")
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", trace_out=str(trace_dir))
    llm.generate(["Hello there", "Tell me a story"], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    return str(trace_dir)


def test_engine_traces_via_cli(engine_traces, tmp_path):
    out = tmp_path / "trace.json"
    assert main(["traces", "jaeger", engine_traces, "-o", str(out)]) == 0
    converted = json.loads(out.read_text())
    assert _ui_accepts(converted)
    otlp_out = tmp_path / "otlp.json"
    assert main(["traces", "jaeger", engine_traces, "-o", str(otlp_out), "--format", "otlp"]) == 0
    document = json.loads(otlp_out.read_text())

    originals = {s["spanId"]: (s, {a["key"]: a["value"] for a in rs["resource"].get("attributes", [])})
                 for rs in document["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    spans = [span for trace in converted["data"] for span in trace["spans"]]
    assert len(spans) == len(originals) and {s["spanID"] for s in spans} == originals.keys()
    assert sum(s["operationName"] == "llm_request" for s in spans) == 2
    assert len({s["traceID"] for s in spans}) == len(converted["data"])

    for trace in converted["data"]:
        ids = _spans(trace)
        assert any(all(r["refType"] != "CHILD_OF" for r in span["references"]) for span in trace["spans"])  # a root
        for span in trace["spans"]:
            original, resource = originals[span["spanID"]]
            start, end = int(original["startTimeUnixNano"]), int(original["endTimeUnixNano"])
            assert (span["startTime"], span["duration"]) == (start // 1000, (end - start) // 1000)
            parent = [r for r in span["references"] if r["refType"] == "CHILD_OF"]
            if original.get("parentSpanId"):
                assert parent[0] == {"refType": "CHILD_OF", "traceID": trace["traceID"],
                                     "spanID": original["parentSpanId"]}
                assert parent[0]["spanID"] in ids  # the parent is in the same entry
            process = trace["processes"][span["processID"]]
            assert process["serviceName"] == resource["service.name"]["stringValue"]
            assert {t["key"] for t in process["tags"]} == resource.keys() - {"service.name"}
            for tag in span["tags"]:
                assert type(tag["value"]) is {"string": str, "bool": bool, "int64": int, "float64": float}[tag["type"]]
        # One process per distinct resource, each used by a span.
        assert len({json.dumps(p, sort_keys=True) for p in trace["processes"].values()}) == len(trace["processes"])
        assert {span["processID"] for span in trace["spans"]} == trace["processes"].keys()
