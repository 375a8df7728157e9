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


def test_generate_runs_several_prompts_as_one_batch(bundled_model_dir, tmp_path):
    """PROMPT arguments and --prompts-file lines go to one LLM.generate call: the first step prefills
    them all together, and each completion is printed after its prompt, in order."""
    trace_dir, prompts_file = tmp_path / "traces", tmp_path / "prompts.txt"
    prompts_file.write_text("Once upon a time\n\nThe sky is\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "tracevllm.entrypoints.cli", "generate", "The capital of France is",
         "Hello, my name is", "--prompts-file", str(prompts_file), "--max-tokens", "3", "--dtype", "float32",
         "--max-model-len", "512", "--trace-out", str(trace_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split(", Generated text: ")[0] for line in lines] == [
        "Prompt: 'The capital of France is'", "Prompt: 'Hello, my name is'", "Prompt: 'Once upon a time'",
        "Prompt: 'The sky is'"]
    spans = load_spans(trace_dir)
    assert sum(s["name"] == "llm_request" for s in spans) == 4
    first = min((s for s in spans if s["name"] == "engine_step"), key=lambda s: int(s["startTimeUnixNano"]))
    attrs = {a["key"]: a["value"] for a in first["attributes"]}
    assert attrs["step.batch_size"] == {"intValue": "4"}
