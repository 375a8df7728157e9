"""``tracevllm traces whatif``: a run replayed under its own configuration is the run, step for step
and block for block; under another configuration the schedule changes as the scheduler's rules say;
the predicted trace is a trace like any other (every test's traces also pass ``traces check``, by the
suite's autouse fixture)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracevllm.entrypoints.cli import main as cli
from tracevllm.tracing.schema import Attr, EventName, SpanName
from tracevllm.whatif import SETTINGS
from tracevllm.whatif.command import whatif
from viz.explain import explain
from viz.report import write_report
from viz.trace_loader import load_trace
from viz.model import Trace

ROOT = Path(__file__).parents[2]


def _steps(trace: Trace) -> dict[int, dict]:
    """Every engine_step span's attributes: the batch, the gauges, every block change."""
    return {s.attributes[Attr.STEP_NUMBER]: s.attributes for s in trace.spans if s.name == SpanName.ENGINE_STEP}


def _lives(trace: Trace) -> dict[str, list[tuple]]:
    """Every scheduler.request's events (admissions with their blocks and prefix lookups, waits,
    preemptions, the finish), without their times."""
    return {s.attributes[Attr.REQUEST_ID]: [(e.name, e.attributes) for e in s.events]
            for s in trace.spans if s.name == SpanName.SCHEDULER_REQUEST}


def test_a_run_replayed_under_its_own_configuration_is_the_run(recorded_run, tmp_path):
    w = whatif(recorded_run, [], str(tmp_path / "same"))
    recorded, predicted = load_trace(recorded_run), load_trace(str(tmp_path / "same"))
    steps = _steps(recorded)
    # The run has what the replay must get right: prompt chunks, preemptions, prefix-cache hits.
    assert any(s.preempted_req_ids for s in recorded.steps)
    assert any(not d and c + n < recorded.requests[r].num_prompt_tokens for s in recorded.steps
               for r, n, d, c in zip(s.req_ids, s.req_num_tokens, s.req_is_decode, s.req_num_computed_tokens))
    assert any(s.prefix_hits for s in recorded.steps)
    assert _steps(predicted) == steps
    assert _lives(predicted) == _lives(recorded)
    for request_id, r in recorded.requests.items():
        p = predicted.requests[request_id]
        assert (p.num_output_tokens, p.finish_reason, p.num_preemptions, p.n, p.parent_request_id) == (
            r.num_output_tokens, r.finish_reason, r.num_preemptions, r.n, r.parent_request_id)
    assert w.changes == {} and w.predicted.num_steps == len(steps)


def test_a_smaller_token_budget_gives_more_chunks(recorded_run, tmp_path):
    whatif(recorded_run, ["max_num_batched_tokens=8"], str(tmp_path / "budget8"))
    recorded, predicted = load_trace(recorded_run), load_trace(str(tmp_path / "budget8"))

    def prefill_steps(trace: Trace) -> int:
        return sum(not d for s in trace.steps for d in s.req_is_decode)

    assert all(s.num_scheduled_tokens <= 8 and s.token_budget == 8 for s in predicted.steps)
    assert prefill_steps(predicted) > prefill_steps(recorded)
    assert len(predicted.steps) > len(recorded.steps)
    assert {r: p.num_output_tokens for r, p in predicted.requests.items()} == {
        r: p.num_output_tokens for r, p in recorded.requests.items()}


def test_the_settings_change_the_schedule_as_the_scheduler_says(recorded_run, tmp_path):
    whatif(recorded_run, ["num_gpu_blocks_override=64"], str(tmp_path / "big_cache"))
    big = load_trace(str(tmp_path / "big_cache"))
    assert not any(s.preempted_req_ids for s in big.steps) and big.steps[0].num_gpu_blocks == 64
    whatif(recorded_run, ["max_num_seqs=1", "max_num_batched_tokens=64"], str(tmp_path / "one_at_a_time"))
    assert all(s.batch_size <= 1 for s in load_trace(str(tmp_path / "one_at_a_time")).steps)
    whatif(recorded_run, ["enable_prefix_caching=false"], str(tmp_path / "no_prefix_caching"))
    off = load_trace(str(tmp_path / "no_prefix_caching"))
    assert not any(s.prefix_hits for s in off.steps)
    assert all(a.miss_reason == "prefix_caching_off" for r in off.requests.values() for a in r.admissions)
    whatif(recorded_run, ["long_prefill_token_threshold=8"], str(tmp_path / "long_prefill"))
    cut = load_trace(str(tmp_path / "long_prefill"))
    assert max(n for s in cut.steps for n in s.req_num_tokens) == 8


def test_the_predicted_trace_reads_as_any_other(recorded_run, tmp_path, capsys):
    out = tmp_path / "same"
    # The recorded memory holds 8 blocks of 8 tokens, the null block among them: too few for max_model_len.
    whatif(recorded_run, ["block_size=8", "num_gpu_blocks_override=9"], str(out))
    predicted = load_trace(str(out))
    assert set(predicted.requests) == set(load_trace(recorded_run).requests)
    assert all(r.ttft is not None and r.e2e is not None and r.e2e >= r.ttft > 0 for r in predicted.requests.values())
    assert explain(predicted)  # traces explain's accounting
    assert (tmp_path / "report" / "report.html").samefile(write_report(predicted, str(tmp_path / "report")))
    assert cli(["traces", "jaeger", str(out), "-o", str(tmp_path / "jaeger.json")]) == 0
    assert cli(["traces", "check", str(out)]) == 0
    capsys.readouterr()


def test_the_command_prints_both_runs_and_rejects_what_it_cannot_replay(recorded_run, tmp_path, capsys):
    assert cli(["traces", "whatif", recorded_run, "--set", "max_num_batched_tokens=16", "-o", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "scheduler.max_num_batched_tokens 32 -> 16" in printed and "predicted" in printed
    assert cli(["traces", "whatif", recorded_run, "--set", "max_num_seqs=4", "--json", "-o", str(tmp_path / "b")]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["changes"] == {Attr.MAX_NUM_SEQS: {"recorded": 8, "predicted": 4}}
    assert answer["predicted"]["num_requests"] == answer["recorded"]["num_requests"] == 7
    for bad, message in [("max_num_seq=4", "Did you mean max_num_seqs"), ("max_num_seqs=four", "must be an integer"),
                         ("max_num_seqs=0", "max_num_seqs must be >= 1"), ("block_size=3", "must be one of"),
                         ("enable_prefix_caching=maybe", "must be true or false"),
                         ("scheduling_policy=lifo", "must be one of fcfs, priority"), ("max_num_seqs", "KEY=VALUE"),
                         ("num_gpu_blocks_override=8", "fewer than max_model_len"),
                         ("max_num_batched_tokens=4", "max_num_batched_tokens must be >= max_num_seqs")]:
        assert cli(["traces", "whatif", recorded_run, "--set", bad, "-o", str(tmp_path / "bad")]) == 2, bad
        assert message in capsys.readouterr().err, bad
    assert cli(["traces", "whatif", recorded_run, "-o", str(tmp_path / "a")]) == 2  # it holds a trace already
    assert "already holds trace files" in capsys.readouterr().err


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(["traces", "whatif", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--set KEY=VALUE" in text and "--arrival-scale" in text and "--num-requests" in text
    assert all(name in text for name in SETTINGS)


def test_more_requests_at_a_higher_rate(recorded_run, tmp_path):
    w = whatif(recorded_run, [], str(tmp_path / "more"), arrival_scale=2.0, num_requests=20, seed=3)
    predicted = load_trace(str(tmp_path / "more"))
    parents = {r.parent_request_id for r in predicted.requests.values()}
    assert len(parents) == 20 and all(p.split("-", 1)[0].isdigit() for p in parents)
    assert w.predicted.num_requests == len(predicted.requests) >= 20


def test_a_trace_without_the_configuration_is_refused(recorded_run, tmp_path):
    """A trace of format 2 (before the start-up carried the scheduler's configuration)."""
    old = tmp_path / "old"
    shutil.copytree(recorded_run, old)
    for path in old.glob("*.jsonl"):
        text = path.read_text().replace(f'"{Attr.ENABLE_CHUNKED_PREFILL}"', '"something.else"')
        path.write_text(text)
    with pytest.raises(ValueError, match=f"lack {Attr.ENABLE_CHUNKED_PREFILL}: the run was recorded before traces "
                                         "carried the engine's configuration"):
        whatif(str(old), [], str(tmp_path / "out"))


def test_the_scheduler_and_the_replay_load_no_torch():
    code = ("import sys\n"
            "import tracevllm.core.sched.scheduler, tracevllm.core.kv_cache_manager, tracevllm.whatif.command\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"


def test_every_recorded_request_event_is_replayed(recorded_run, tmp_path):
    """The names of the events, in order, per request (an event kind the replay lost would show)."""
    whatif(recorded_run, ["max_num_batched_tokens=12"], str(tmp_path / "p"))
    names = {e for events in _lives(load_trace(str(tmp_path / "p"))).values() for e, _ in events}
    assert {EventName.QUEUED, EventName.SCHEDULED, EventName.FINISHED} <= names
