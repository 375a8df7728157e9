"""``tracevllm generate --trace-out``: the trace file holds every stage span, correctly parented."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trace_utils import load_spans

pytestmark = pytest.mark.slow

REQUEST_STAGES = {"tokenize", "scheduler.request", "prefill", "decode", "detokenize"}
STEP_STAGES = ["schedule", "execute_model", "sample", "update_from_output"]


def test_generate_writes_stage_spans(bundled_model_dir, tmp_path):
    trace_dir = tmp_path / "traces"
    result = subprocess.run(
        [sys.executable, "-m", "tracevllm.entrypoints.cli", "generate", "The capital of France is",
         "--max-tokens", "6", "--dtype", "float32", "--max-model-len", "512", "--trace-out", str(trace_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    spans = load_spans(trace_dir)
    by_name: dict[str, list[dict]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)

    (root,) = by_name["llm_request"]
    assert "parentSpanId" not in root or not root["parentSpanId"]
    attrs = {a["key"]: a["value"] for a in root["attributes"]}
    assert attrs["gen_ai.usage.completion_tokens"] == {"intValue": "6"}
    for stage in REQUEST_STAGES:
        assert by_name.get(stage), f"no {stage} span"
        for s in by_name[stage]:
            assert s["traceId"] == root["traceId"] and s["parentSpanId"] == root["spanId"], stage
    (detokenize,) = by_name["detokenize"]  # one for the request, with its counts: not one per token
    assert {a["key"]: a["value"] for a in detokenize["attributes"]}["detokenize.num_tokens"] == {"intValue": "6"}

    (sched_span,) = by_name["scheduler.request"]
    events = {e["name"]: {a["key"]: a["value"] for a in e.get("attributes", [])} for e in sched_span["events"]}
    assert list(events) == ["QUEUED", "SCHEDULED", "FINISHED"]
    assert events["SCHEDULED"]["block_ids"] == events["FINISHED"]["block_ids"]  # one block: 5 + 6 tokens

    steps = by_name["engine_step"]
    assert len(steps) == 6  # one prefill step that samples, then five decodes
    step_ids = {s["spanId"] for s in steps}
    for stage in STEP_STAGES:
        assert len(by_name[stage]) == 6
        assert all(s["parentSpanId"] in step_ids for s in by_name[stage])
    for step in steps:
        assert step["traceId"] != root["traceId"]  # a trace of its own ...
        assert any(link["spanId"] == sched_span["spanId"] for link in step["links"])  # ... linked to the request
    sched_attrs = {a["key"]: a["value"] for a in sched_span["attributes"]}  # ... which names the steps
    assert sched_attrs["request.steps"] == {"stringValue": "1-6"} and sched_attrs["request.num_steps"] == {"intValue": "6"}
