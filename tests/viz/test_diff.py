"""``tracevllm traces diff A B``: two runs of one workload compared, recorded offline with the tiny model.

- Two runs of the same configuration never part.
- A cache of 16 KV blocks against one of 32 parts exactly at the 16-block run's first preemption,
  and says who forced it; ``max_num_seqs`` 2 against 8 parts at step 1, where the requests it holds
  back wait for ``max_num_seqs`` (and the summary does not speak of steps before step 1).
- ``--json`` has every request and the summary; ``-o`` draws a readable picture.
- Another workload (a request id, a prompt length) or a trace of format 1 is refused: exit 2, one line.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest

from tests.viz.test_viz_scale import assert_readable
from tests.viz.test_workload import _strip_trace_format
from tracevllm import LLM, SamplingParams
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.entrypoints.cli import main as cli
from tracevllm.tracing.schema import Attr
from viz.diff import compare_runs
from viz.trace_loader import load_trace
from viz.plots.aligned_timelines import plot_aligned_timelines

# Four distinct prompts of 6 tokens (2 blocks of 4 each), all admitted in step 1, that each grow to 25
# computed tokens (7 blocks): 28 blocks in all, so 32 blocks never preempt and 16 must (each count
# without the null block: num_gpu_blocks_override 33 and 17).
PROMPTS = [{"prompt_token_ids": [100 + 10 * i + k for k in range(6)]} for i in range(4)]
PARAMS = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
ENGINE = dict(dtype="float32", block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64,
              num_gpu_blocks_override=33)


@dataclass
class Run:
    """A trace directory, and each preemption as the scheduler made it: (the engine step that
    scheduled it, counted by ``Scheduler.schedule`` calls, and the victim's id)."""

    trace_dir: str
    preemptions: list[tuple[int, str]]


@pytest.fixture(scope="module")
def record(tiny_checkpoint, tmp_path_factory):
    """``record(name, **engine overrides)`` -> a ``Run`` of ``PROMPTS``, recorded once per name."""
    recorded: dict[str, Run] = {}

    def run(name: str, **overrides) -> Run:
        if name in recorded:
            return recorded[name]
        trace_dir = str(tmp_path_factory.mktemp(f"diff_{name}"))
        step, preemptions = [0], []
        schedule, preempt = Scheduler.schedule, Scheduler._preempt

        def counting_schedule(self):
            step[0] += 1
            return schedule(self)

        def noting_preempt(self, request, *args):
            preemptions.append((step[0], request.request_id))
            return preempt(self, request, *args)

        llm = LLM(tiny_checkpoint("llama"), trace_out=trace_dir, **{**ENGINE, **overrides})
        try:
            with pytest.MonkeyPatch.context() as patch:  # after the start-up: count the steps of this run only
                patch.setattr(Scheduler, "schedule", counting_schedule)
                patch.setattr(Scheduler, "_preempt", noting_preempt)
                llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        finally:
            llm.llm_engine.shutdown()
        recorded[name] = Run(trace_dir, preemptions)
        return recorded[name]

    return run


def test_two_runs_of_one_configuration_never_part(record, capsys):
    a, b = record("blocks32").trace_dir, record("blocks32_again").trace_dir
    comparison = compare_runs(load_trace(a), load_trace(b))
    assert comparison.divergence is None and comparison.schedules_compared
    assert comparison.num_steps_same == len(comparison.a.steps) == len(comparison.b.steps) >= 20
    assert [r.request_id for r in comparison.requests] == ["0", "1", "2", "3"]
    assert all(r.e2e_delta is not None and r.ttft_delta is not None for r in comparison.requests)
    assert cli(["traces", "diff", a, b]) == 0
    out = capsys.readouterr().out
    assert f"the schedules never part: all {comparison.num_steps_same} steps are the same in both" in out
    assert "TTFT: A median" in out and "e2e: A median" in out


def test_16_blocks_part_from_32_at_the_first_preemption(record, capsys):
    blocks32, blocks16 = record("blocks32"), record("blocks16", num_gpu_blocks_override=17)
    assert not blocks32.preemptions and blocks16.preemptions, "16 blocks must preempt, 32 must not"
    first_step, victim = blocks16.preemptions[0]
    a, b = load_trace(blocks32.trace_dir), load_trace(blocks16.trace_dir)
    first = next(p for p in b.requests[victim].preempted if p.step == first_step)  # the trace's PREEMPTED

    comparison = compare_runs(a, b)
    d = comparison.divergence
    assert d is not None and d.step == first_step
    assert comparison.num_steps_same >= first_step - 1
    assert [s.req_ids for s in a.steps[:first_step - 1]] == [s.req_ids for s in b.steps[:first_step - 1]]
    difference = next(x for x in d.differences if x.request_id == victim)
    assert (difference.a.state, difference.a.is_decode, difference.b.state) == ("scheduled", True, "preempted")
    assert difference.why.startswith(f"in A request {victim} was scheduled (1 decode token); in B it was preempted: ")
    who = "it needed" if first.forced_by == victim else f"{first.forced_by} needed"
    assert f"{who} {first.num_blocks_needed} block" in difference.why
    assert f"the KV of {first.num_lost_tokens} tokens was lost" in difference.why
    last_step = {name: trace.requests[victim].chunks[-1].step for name, trace in (("a", a), ("b", b))}
    assert last_step["b"] > last_step["a"]  # it waited, then computed its tokens again

    assert cli(["traces", "diff", blocks32.trace_dir, blocks16.trace_dir]) == 0
    out = capsys.readouterr().out
    assert f"the schedules part at step {d.step} (" in out and difference.why in out


def test_a_smaller_max_num_seqs_parts_at_step_one_and_says_who_waits(record, capsys):
    a, b = record("blocks32").trace_dir, record("seqs2", max_num_seqs=2).trace_dir
    comparison = compare_runs(load_trace(a), load_trace(b))
    d = comparison.divergence
    assert d is not None and d.step == 1
    held_back = {x.request_id: x for x in d.differences}
    assert sorted(held_back) == ["2", "3"]
    for x in held_back.values():
        assert (x.a.state, x.a.num_tokens, x.a.is_decode) == ("scheduled", 6, False)
    assert (held_back["2"].b.state, held_back["2"].b.reason) == ("waiting", "max_num_seqs")
    assert held_back["2"].why == "in A request 2 was scheduled (6 prefill tokens); in B it waited: max_num_seqs requests ran"
    assert (held_back["3"].b.state, held_back["3"].b.reason) == ("waiting", "queued_behind")
    assert held_back["3"].why == ("in A request 3 was scheduled (6 prefill tokens); in B it waited: behind the request "
                                  "ahead of it in the queue (2); at the queue's head: max_num_seqs requests ran")
    assert cli(["traces", "diff", a, b]) == 0
    out = capsys.readouterr().out
    assert "the schedules part at step 1 (" in out and "the first step: none came before it)" in out
    assert "the steps before it are the same" not in out  # there are none


def test_prefix_caching_off_parts_where_the_shared_prefix_was_hit(tiny_checkpoint, tmp_path):
    """One request at a time, three prompts sharing 2 blocks: with the prefix cache the second one
    computes only its last 3 tokens; without, all 11; the difference names both lookups."""
    shared = list(range(500, 508))
    prompts = [{"prompt_token_ids": shared + [600 + 10 * i + k for k in range(3)]} for i in range(3)]
    runs = {}
    for name, caching in (("on", True), ("off", False)):
        runs[name] = str(tmp_path / name)
        llm = LLM(tiny_checkpoint("llama"), trace_out=runs[name], **{**ENGINE, "max_num_seqs": 1},
                  enable_prefix_caching=caching)
        try:
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
        finally:
            llm.llm_engine.shutdown()
    comparison = compare_runs(load_trace(runs["on"]), load_trace(runs["off"]))
    d = comparison.divergence
    second_admitted = load_trace(runs["on"]).requests["1"].admissions[0].step
    assert d is not None and d.step == second_admitted and [x.request_id for x in d.differences] == ["1"]
    (x,) = d.differences
    assert (x.a.num_tokens, x.b.num_tokens) == (3, 11)
    assert x.why == ("in A request 1 was scheduled (3 prefill tokens); in B it was scheduled (11 prefill tokens): "
                     "it had 8 tokens computed before the step in A, 0 in B; in A its prefix-cache lookup: 2 of 2 "
                     "full blocks hit; what is left is less than a full block; in B its prefix-cache lookup: 0 of 0 "
                     "full blocks hit; prefix caching is off")


def test_json_has_every_request_and_the_summary(record, tmp_path, capsys):
    picture = tmp_path / "aligned.png"
    a, b = record("blocks32").trace_dir, record("blocks16", num_gpu_blocks_override=17).trace_dir
    assert cli(["traces", "diff", a, b, "--json", "-o", str(picture)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"a", "b", "matched_by", "schedules_compared", "num_steps_same", "divergence", "requests",
                             "summary", "picture"}
    assert document["matched_by"] == "id"
    assert document["picture"] == str(picture) and picture.stat().st_size > 0
    assert set(document["a"]) == {"directory", "num_steps", "num_requests"} and document["a"]["num_requests"] == 4
    divergence = document["divergence"]
    assert set(divergence) == {"step", "start_a", "start_b", "differences"}
    for x in divergence["differences"]:
        assert set(x) == {"request_id", "a", "b", "why"}
        assert set(x["a"]) == set(x["b"]) == {"state", "num_tokens", "is_decode", "reason"}
    assert [r["request_id"] for r in document["requests"]] == ["0", "1", "2", "3"]
    for r in document["requests"]:
        assert set(r) == {"request_id", "ttft_a", "ttft_b", "ttft_delta", "e2e_a", "e2e_b", "e2e_delta"}
        assert r["e2e_delta"] == pytest.approx(r["e2e_b"] - r["e2e_a"])
    for metric in ("ttft", "e2e"):
        assert set(document["summary"][metric]) == {"a", "b", "delta", "abs_relative_delta"}
        assert all(set(v) == {"median", "p90"} for v in document["summary"][metric].values())


def test_the_picture_is_readable(record):
    comparison = compare_runs(load_trace(record("blocks32").trace_dir),
                              load_trace(record("blocks16", num_gpu_blocks_override=17).trace_dir))
    figure = plot_aligned_timelines(comparison)
    texts = [t.get_text() for t in assert_readable(figure)]
    assert any(f"schedules part at step {comparison.divergence.step}" in t for t in texts)
    assert any(t.startswith("#0") for t in texts) and "first token, B" in texts


def _rewrite(src: str, dst, change) -> None:
    """``src``'s trace files with ``change`` applied to every JSON object of every line."""
    shutil.copytree(src, dst)

    def walk(obj):
        if isinstance(obj, dict):
            change(obj)
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    for path in dst.glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for line in lines:
            walk(line)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _refusal(capsys, a: str, b: str) -> str:
    assert cli(["traces", "diff", a, b]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: ")
    return captured.err


@pytest.mark.broken_traces  # the copies are spoilt on purpose
def test_another_workload_or_an_old_trace_is_refused(record, tmp_path, capsys):
    a = record("blocks32").trace_dir

    def rename_request_3(obj: dict) -> None:
        if obj.get("stringValue") == "3":
            obj["stringValue"] = "x3"

    def lengthen_prompt_of_0(obj: dict) -> None:
        attributes = obj.get("attributes", [])
        if {"key": Attr.REQUEST_ID, "value": {"stringValue": "0"}} in attributes:
            for kv in attributes:
                if kv["key"] == Attr.NUM_PROMPT_TOKENS:
                    kv["value"] = {"intValue": "7"}

    _rewrite(a, tmp_path / "other_ids", rename_request_3)
    err = _refusal(capsys, a, str(tmp_path / "other_ids"))
    assert "are not runs of the same workload (requests are matched by id): ids only in A: '3'; only in B: 'x3'" in err
    _rewrite(a, tmp_path / "other_length", lengthen_prompt_of_0)
    err = _refusal(capsys, a, str(tmp_path / "other_length"))
    assert "request '0' has 6 prompt tokens in A and 7 in B" in err
    _strip_trace_format(a, tmp_path / "old")
    err = _refusal(capsys, str(tmp_path / "old"), a)
    assert "is a trace of format 1, recorded before traces carried their workload" in err


@pytest.mark.broken_traces  # a copy with other request ids, as a server's second run has
def test_runs_with_other_request_ids_are_matched_by_arrival(record, tmp_path, capsys):
    """A server's request ids are random: B's requests, none of whose ids A has, are matched to A's by
    arrival and prompt length, and the comparison is the one the same ids give."""
    a, b = record("blocks32").trace_dir, record("blocks16", num_gpu_blocks_override=17).trace_dir
    ids = {"0": "cmpl-9f", "1": "cmpl-3c", "2": "cmpl-a1", "3": "cmpl-07"}

    def rename_every_request(obj: dict) -> None:
        if obj.get("stringValue") in ids:
            obj["stringValue"] = ids[obj["stringValue"]]

    _rewrite(b, tmp_path / "served_ids", rename_every_request)
    by_id = compare_runs(load_trace(a), load_trace(b))
    by_arrival = compare_runs(load_trace(a), load_trace(str(tmp_path / "served_ids")))
    assert (by_id.matched_by, by_arrival.matched_by) == ("id", "arrival")
    assert by_arrival.divergence == by_id.divergence and by_arrival.num_steps_same == by_id.num_steps_same
    assert by_arrival.requests == by_id.requests
    assert cli(["traces", "diff", a, str(tmp_path / "served_ids")]) == 0
    assert "B's requests are matched to A's by arrival and prompt length" in capsys.readouterr().out


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["traces", "diff", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "PICTURE" in out and "schedules part" in out
