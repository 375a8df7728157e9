"""``tracevllm traces explain``: crafted runs on the bundled model, each explained from its trace.

- One long prompt ahead of four short ones, with a token budget of 128: the short requests' first
  tokens wait for the long prompt's chunks, and the explanation says so.
- A KV cache small enough to preempt: each preemption names who needed the blocks, and the tokens
  it lost are the tokens computed again.
- Three prefix-cache misses, each with its reason: a partial block, a block evicted by a named
  request at a named step, and content never stored.
- In every run, every request's parts add up to its e2e.
- A step stalled for a second (a busy machine) is named as the machine's, not another request's decode.
- Requests are named as the live page names them, ``#i`` in the order they were queued, id after.
"""

from __future__ import annotations

import json
import time

import pytest

from tracevllm import LLM, SamplingParams
from tests.viz.synthetic import synthetic_trace
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.entrypoints.cli import main as tracevllm_main
from viz.explain import PARTS, describe, explain, page_labels, run_model, slow_steps
from viz.trace_loader import load_trace

pytestmark = pytest.mark.slow

GREEDY = dict(temperature=0, ignore_eos=True)


def _run(trace_dir, batches, **engine) -> None:
    llm = LLM(None, trace_out=str(trace_dir), dtype="float32", **engine)
    try:
        for prompts, params in batches:
            llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def long_ahead_dir(bundled_model_dir, tmp_path_factory):
    """A 1,600-token prompt, then four short ones, all at once, 128 tokens a step."""
    trace_dir = tmp_path_factory.mktemp("explain_long_ahead")
    long = "Tell me a story about the sea. " * 200
    shorts = [f"Question {i}: what is {i} plus {i}?" for i in range(4)]
    _run(trace_dir, [([long, *shorts], SamplingParams(max_tokens=4, **GREEDY))],
         max_num_batched_tokens=128, max_num_seqs=16)
    return trace_dir


@pytest.fixture(scope="module")
def preempting_dir(bundled_model_dir, tmp_path_factory):
    """Four requests that grow to 4 blocks each in a cache of 8 blocks of 16 tokens (9 with the null block)."""
    trace_dir = tmp_path_factory.mktemp("explain_preempting")
    prompts = [f"Count slowly from {i} to one hundred, please." for i in range(4)]
    _run(trace_dir, [(prompts, SamplingParams(max_tokens=40, **GREEDY))], num_gpu_blocks_override=9,
         max_num_seqs=8, max_model_len=128)
    return trace_dir


SHARED = "You are a helpful assistant. Answer in one short sentence, and be kind about it. " * 2


@pytest.fixture(scope="module")
def prefix_dir(bundled_model_dir, tmp_path_factory):
    """The same prompt three times, one request after another: first no block was ever stored, then
    every full block hits and only the partial last block is left, then, after a long prompt has
    taken every block of the 16-block cache (17 with the null block), the first block was evicted for it."""
    trace_dir = tmp_path_factory.mktemp("explain_prefix")
    one = SamplingParams(max_tokens=1, **GREEDY)
    evictor = {"prompt_token_ids": list(range(1000, 1250))}  # 250 tokens: all 16 blocks
    _run(trace_dir, [([SHARED], one), ([SHARED], one), ([evictor], one), ([SHARED], one)],
         num_gpu_blocks_override=17, max_num_seqs=4, max_model_len=256)
    return trace_dir


def test_short_requests_are_charged_to_the_long_prompt_ahead(long_ahead_dir):
    trace = load_trace(str(long_ahead_dir))
    long_id = max(trace.requests.values(), key=lambda r: r.num_prompt_tokens).request_id
    assert trace.requests[long_id].num_prompt_tokens >= 1500
    explanations = {x.request_id: x for x in explain(trace)}
    shorts = [r for r in trace.requests.values() if r.request_id != long_id]
    for request in shorts:
        x = explanations[request.request_id]
        assert x.blamed[long_id] >= 0.5 * x.ttft_s, (x.blamed, x.ttft_s)
        assert x.parts["queued.token_budget"] > 0  # behind the head or at it, the queue waited for the budget
    waits = {r.request_id: r.waits for r in shorts}
    assert all(len(w) == 1 for w in waits.values())  # one record for the whole wait, not one per step
    (head,) = [w for (w,) in waits.values() if w.reason == "token_budget"]
    assert long_id in head.blocked_by
    behind = [w for (w,) in waits.values() if w.reason == "queued_behind"]
    assert len(behind) == len(shorts) - 1 and len({w.blocked_by for w in behind}) == len(behind)  # a chain


def test_each_preemption_names_who_needed_the_blocks_and_the_lost_tokens_are_recomputed(preempting_dir):
    trace = load_trace(str(preempting_dir))
    preempted = [r for r in trace.requests.values() if r.preempted]
    assert preempted
    for request in preempted:
        for p in request.preempted:
            assert p.forced_by in trace.requests and p.num_blocks_needed > p.num_free_blocks
            # the resume after it: the prefix hit plus the recomputed chunks are the lost tokens and
            # the one sampled token whose KV was never computed
            resume = next(a for a in request.admissions if a.resumed and a.step > p.step)
            chunks = [c for c in request.chunks if c.step >= resume.step]
            recomputed = 0
            for c in chunks:
                if c.is_decode:
                    break
                recomputed += c.num_tokens
            assert resume.num_computed_tokens + recomputed == p.num_lost_tokens + 1
        x = next(x for x in explain(trace) if x.request_id == request.request_id)
        assert x.parts["preempted.waiting"] > 0 and x.parts["preempted.recompute"] > 0
        assert any("preempted at step" in note for note in x.notes)


def test_three_prefix_misses_each_with_its_reason(prefix_dir):
    trace = load_trace(str(prefix_dir))
    first, again, evictor, third = trace.requests.values()
    (a,) = first.admissions
    assert (a.num_blocks_hit, a.miss_reason) == (0, "never_stored")
    (a,) = again.admissions
    assert a.num_blocks_hit == a.num_blocks_looked_up > 0 and a.miss_reason == "partial_block"
    (a,) = third.admissions
    evicted_in = evictor.admissions[0].step
    assert (a.num_blocks_hit, a.miss_reason, a.miss_evicted_for, a.miss_evicted_step) == (
        0, "evicted", evictor.request_id, evicted_in)
    x = next(x for x in explain(trace) if x.request_id == third.request_id)
    assert f"evicted at step {evicted_in} for {evictor.request_id}" in " ".join(x.notes)


@pytest.mark.parametrize("which", ["long_ahead_dir", "preempting_dir", "prefix_dir"])
def test_parts_add_up_to_the_e2e_and_the_cli_prints_them(which, request, capsys):
    trace_dir = str(request.getfixturevalue(which))
    explanations = explain(load_trace(trace_dir))
    assert explanations
    for x in explanations:
        assert set(x.parts) <= set(PARTS)
        assert abs(sum(x.parts.values()) - x.e2e_s) <= max(1e-3, 0.005 * x.e2e_s), (x.request_id, x.parts)
    assert tracevllm_main(["traces", "explain", trace_dir, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["requests"]
    assert [r["request_id"] for r in printed] == [x.request_id for x in explanations]
    assert set(printed[0]) == {"request_id", "label", "e2e_s", "ttft_s", "parts", "blamed", "gaps"}
    first = explanations[0]
    for which in (first.request_id, first.label):
        assert tracevllm_main(["traces", "explain", trace_dir, "--request", which]) == 0
        assert capsys.readouterr().out.startswith(f"{first.label} ({first.request_id}): ")


def test_jaeger_export_puts_the_parts_on_the_request_spans(long_ahead_dir, tmp_path):
    """``traces jaeger`` adds ``why.<part>`` to ``scheduler.request`` and its ``llm_request`` (n = 1),
    so the Jaeger UI shows where each request's latency went."""
    out = tmp_path / "jaeger.json"
    assert tracevllm_main(["traces", "jaeger", str(long_ahead_dir), "-o", str(out)]) == 0
    explanations = {x.request_id: x for x in explain(load_trace(str(long_ahead_dir)))}
    seen = 0
    for trace in json.loads(out.read_text())["data"]:
        spans = {s["operationName"]: {t["key"]: t["value"] for t in s["tags"]} for s in trace["spans"]}
        if "scheduler.request" not in spans:
            continue
        x = explanations[spans["scheduler.request"]["request.id"]]
        for name in ("scheduler.request", "llm_request"):
            why = {k.removeprefix("why."): v for k, v in spans[name].items()
                   if k.startswith("why.") and not k.startswith("why.blamed")}
            assert why == pytest.approx(x.parts)
        seen += 1
    assert seen == len(explanations) == 5


STALLED_STEP, STALL_S = 12, 1.0


def test_a_stalled_step_is_the_machines_not_another_requests_decode(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """Two requests decode side by side; step 12's schedule sleeps a second (the cores busy elsewhere).
    Its second is over the run's step-cost model by far: both requests charge it to the machine, and
    the long gap before their next token names the step, not the other request's decode."""
    schedule, calls = Scheduler.schedule, [0]

    def stalled_schedule(self):
        calls[0] += 1
        if calls[0] == STALLED_STEP:
            time.sleep(STALL_S)
        return schedule(self)

    monkeypatch.setattr(Scheduler, "schedule", stalled_schedule)
    # One thread, chosen: no thread-count probe (which the step-cost fits leave out) lands on the stall.
    llm = LLM(tiny_checkpoint("llama"), trace_out=str(tmp_path), dtype="float32", max_model_len=64, cpu_threads=1)
    llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9, 10]}],
                 SamplingParams(max_tokens=30, **GREEDY), use_tqdm=False)
    trace = load_trace(str(tmp_path))
    slow = slow_steps(trace.steps, run_model(trace))
    duration, predicted = slow[STALLED_STEP]
    assert duration >= STALL_S > 10 * predicted
    for x in explain(trace):
        assert x.parts["slower_than_usual"] >= 0.9 * STALL_S, x.parts
        assert abs(sum(x.parts.values()) - x.e2e_s) <= max(1e-3, 0.005 * x.e2e_s)
        assert x.parts.get("other_requests", 0.0) < 0.5 * STALL_S  # the other's decode is not blamed
        gap = next(g for g in x.gaps if g.step == STALLED_STEP + 1 or g.step == STALLED_STEP)
        assert gap.cause.startswith(f"step {STALLED_STEP} took {duration:.3f} s where the run's step-cost model "
                                    f"predicts {predicted:.3f} s: the machine was slower than usual")
    assert tracevllm_main(["traces", "explain", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("machine slower than usual (steps far over the run's step-cost model) 1.") == 2
    assert "'s decode:" not in out.split(f"Token after step {STALLED_STEP}")[1].split("\n")[0]


def test_requests_are_named_as_the_live_page_names_them():
    """``#i``: the i-th request queued, from 0 (the page's model.js numbers them as their RequestQueued
    events come); explain prints it first, the id after, and charges the others by it."""
    trace = synthetic_trace(num_requests=20, num_blocks=400, num_steps=120)
    labels = page_labels(trace.requests.values())
    by_queued = sorted(trace.requests.values(), key=lambda r: r.queued)
    assert [labels[r.request_id] for r in by_queued] == [f"#{i}" for i in range(len(by_queued))]
    explanations = explain(trace)
    for x in explanations:
        assert x.label == labels[x.request_id]
        text = describe(x, labels)
        assert text.startswith(f"{x.label} ({x.request_id}): ")
        if x.blamed:
            charged = text.split("Charged to other requests: ")[1].split("\n")[0]
            assert charged.startswith("#") and "cmpl-" not in charged
