"""A golden schedule (vLLM's own steps, recorded by tests/parity/record_vllm.py) read as a trace
(``tracevllm/parity/golden_trace.py``), and ``traces diff`` holding a tracevllm run against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracevllm.entrypoints.cli import main as cli
from tracevllm.parity.golden import load_golden
from tracevllm.parity.golden_trace import golden_trace

GOLDENS = Path(__file__).parents[1] / "data" / "vllm_schedules"


@pytest.mark.parametrize("name", ["preemption_recompute", "n_samples", "aborts", "shared_system_prompt"])
def test_the_trace_replays_vllms_blocks_and_requests(name):
    golden = load_golden(GOLDENS / f"{name}.json")
    trace = golden_trace(golden)
    assert len(trace.steps) == len(golden.steps) and trace.num_null_blocks == 1
    # The blocks the steps' changes leave held, plus vLLM's own count of free blocks, plus the null
    # block, are all of them: the reconstruction agrees with vLLM's block pool after every step.
    for step in trace.steps:
        held = {b for blocks in step.blocks_held.values() for b in blocks}
        assert len(held) + step.num_free_blocks + 1 == step.num_gpu_blocks, step.number
        assert 0 not in held
    for r in golden.requests:
        request = trace.requests[r.request_id]
        assert request.finish_reason == r.finish_reason
        assert request.num_output_tokens == len(r.output_token_ids), r.request_id
        assert request.num_preemptions == sum(r.request_id in s.preempted for s in golden.steps)
        assert request.e2e > 0 and (request.ttft is None) == (not r.output_token_ids)


def test_traces_diff_holds_a_tracevllm_run_against_vllms(tmp_path, capsys):
    golden = str(GOLDENS / "preemption_recompute.json")
    same, parted = tmp_path / "same", tmp_path / "parted"
    assert cli(["parity", golden, "--trace-out", str(same)]) == 0
    assert cli(["parity", golden, "--set", "scheduler_reserve_full_isl=false", "--trace-out", str(parted)]) == 1
    first = capsys.readouterr().out.split("first divergent step: ")[1].split(" ")[0]
    assert cli(["traces", "diff", str(same), golden]) == 0
    out = capsys.readouterr().out
    assert f"B: {golden} (330 steps, 16 requests)" in out and "the schedules never part: all 330 steps" in out
    assert cli(["traces", "diff", str(parted), golden, "--json"]) == 0
    divergence = json.loads(capsys.readouterr().out)["divergence"]
    # Where tracevllm, without vLLM 0.32's rule, admitted a request that vLLM kept waiting.
    assert divergence["step"] == int(first)
    (difference,) = divergence["differences"]
    assert difference["a"]["state"] == "scheduled" and difference["b"]["state"] == "waiting"


def test_a_bad_golden_is_refused_by_traces_diff_in_one_line(tmp_path, capsys):
    raw = json.loads((GOLDENS / "aborts.json").read_text())
    raw["options"]["gpu_memory_utilization"] = 0.9
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    assert cli(["traces", "diff", str(bad), str(GOLDENS / "aborts.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: options.gpu_memory_utilization: unknown option") and err.count("\n") == 1
