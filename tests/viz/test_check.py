"""``tracevllm traces check``: the suite's own traces hold every invariant (tests/conftest.py checks
each trace a test records), and six seeded scheduler and KV cache bugs, each a small patch of the
engine, are each caught by the invariant they break."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.core.block_pool import BlockPool
from tracevllm.core.sched.request_queue import FCFSRequestQueue
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.core.sched.step_batch import StepBatch
from tracevllm.core.sched.waiting_reasons import WaitingReasons
from tracevllm.entrypoints.cli import main as cli
from tracevllm.tracing.schema import Attr
from tracevllm.worker.gpu_input_batch import InputBatch
from viz.check import RULES, check_trace, rule

ENGINE = dict(dtype="float32", block_size=4, num_gpu_blocks_override=17, max_model_len=64, max_num_seqs=8,
              max_num_batched_tokens=32)


def _tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_recorded_traces_hold_every_invariant(recording, multiprocess_dir, capsys):
    """Chunked prefill, preemptions and a shared prefix in one process; two processes."""
    for trace_dir in (recording.trace_dir, multiprocess_dir):
        assert cli(["traces", "check", trace_dir]) == 0
        assert capsys.readouterr().out.endswith(f" requests: {len(RULES)} invariants hold\n")


def test_verbose_lists_each_invariant_with_its_rule(recording, capsys):
    """``--verbose`` names what held: each invariant and the first sentence of its checker's docstring."""
    assert cli(["traces", "check", "--verbose", recording.trace_dir]) == 0
    summary, *listed = capsys.readouterr().out.splitlines()
    assert summary.endswith(f" requests: {len(RULES)} invariants hold")
    assert listed == [f"  {name}: {rule(name)}" for name in RULES] and len(listed) == len(RULES)
    assert listed[0] == ("  step_numbers_are_contiguous: Steps are numbered 1, 2, 3 and on, without a gap "
                         "(EventRecorder.step): a gap is a lost step.")


# ---- the seeded bugs: each replaces one method with a subtly wrong version ------------------------

def leak_a_block(free_blocks):
    def free_blocks_but_one(self, ordered_blocks):
        """Skips a free: a request's first block (freed last) loses its reference but never rejoins the
        free queue."""
        free_blocks(self, ordered_blocks[:-1])
        if ordered_blocks:
            ordered_blocks[-1].ref_cnt -= 1
    return free_blocks_but_one


def one_token_over_the_budget(add_waiting):
    def add_waiting_one_more(self, request, num_new_tokens, block_ids, resumed):
        """A prompt chunk cut at the token budget takes one token more (its blocks have room)."""
        if num_new_tokens == self.token_budget < request.num_tokens - request.num_computed_tokens:
            num_new_tokens += 1
        add_waiting(self, request, num_new_tokens, block_ids, resumed)
    return add_waiting_one_more


def peek_past_the_head(peek_request):
    def peek_second(self):
        """Admits out of order: the second request waiting goes first."""
        waiting = iter(self._queue.values())
        head = next(waiting)
        return next(waiting, head)
    return peek_second


def pop_past_the_head(pop_request):
    def pop_second(self):
        request = peek_past_the_head(None)(self)
        del self._queue[request.request_id]
        return request
    return pop_second


def keep_evicted_blocks_findable(evict):
    def evict_but_keep_the_hash(self, block):
        """Forgets the block's hash but leaves it in the hash map: a later prefix hit takes a block
        that was handed out again since."""
        if block.block_hash is None:
            return False
        block.block_hash = None
        return True
    return evict_but_keep_the_hash


def one_seq_too_many(init):
    def init_off_by_one(self, *args, **kwargs):
        """Admits while ``len(running) <= max_num_seqs`` (instead of ``<``)."""
        init(self, *args, **kwargs)
        self.max_num_seqs += 1
    return init_off_by_one


def a_spare_row(init):
    def init_with_a_spare_row(self, max_num_reqs, *args, **kwargs):
        """(Not a bug: the model runner's batch gets a row more than max_num_seqs, so that the
        scheduler's bug reaches the trace instead of the runner's assert.)"""
        init(self, max_num_reqs + 1, *args, **kwargs)
    return init_with_a_spare_row


def forget_the_prefix_hit(add_waiting):
    def add_waiting_from_zero(self, request, num_new_tokens, block_ids, resumed):
        """Drops the prefix-cache hit from the request's computed tokens: the cached prompt is
        computed again."""
        request.num_computed_tokens = 0
        add_waiting(self, request, num_new_tokens, block_ids, resumed)
    return add_waiting_from_zero


def forget_every_step(changed):
    def changed_afresh(self, hold_back, batch):
        """Forgets the reasons recorded: the whole queue records its reason again at every step (what a
        page opening the live stream did while a tracer listened)."""
        self.forget_all()
        return changed(self, hold_back, batch)
    return changed_afresh


EIGHT_TOKEN_PROMPTS = [[_tokens(100 * i, 8) for i in range(1, 5)]]
SHARED_PREFIX = _tokens(500, 12)
BUGS = {
    "skip a free": ([(BlockPool, "free_blocks", leak_a_block)], EIGHT_TOKEN_PROMPTS, {},
                    "blocks_in_use_plus_free_is_total"),
    "token budget + 1": ([(StepBatch, "add_waiting", one_token_over_the_budget)], [[_tokens(100, 40)]],
                         dict(max_num_batched_tokens=30), "token_budget_is_respected"),
    "out of order": ([(FCFSRequestQueue, "peek_request", peek_past_the_head),
                      (FCFSRequestQueue, "pop_request", pop_past_the_head)], EIGHT_TOKEN_PROMPTS, {},
                     "waiting_requests_are_admitted_in_order"),
    # A's 3 blocks are stored, then B (16 blocks) takes every block: A's first block becomes B's last,
    # partial one, never stored again. A again: its stale hash finds that block.
    "stale prefix hit": ([(BlockPool, "_evict", keep_evicted_blocks_findable)],
                         [[SHARED_PREFIX], [_tokens(2000, 61)], [SHARED_PREFIX]], {},
                         "prefix_hits_take_stored_blocks"),
    "max_num_seqs + 1": ([(Scheduler, "__init__", one_seq_too_many), (InputBatch, "__init__", a_spare_row)],
                         EIGHT_TOKEN_PROMPTS, dict(max_num_seqs=2), "max_num_seqs_is_respected"),
    "recompute the hit": ([(StepBatch, "add_waiting", forget_the_prefix_hit)],
                          [[SHARED_PREFIX + [7, 8], SHARED_PREFIX + [9, 10]]], {}, "computed_tokens_grow_by_what_ran"),
    "reasons again": ([(WaitingReasons, "changed", forget_every_step)], EIGHT_TOKEN_PROMPTS, dict(max_num_seqs=1),
                      "a_waiting_reason_is_recorded_once_per_change"),
}


@pytest.mark.broken_traces
@pytest.mark.parametrize("bug", list(BUGS))
def test_each_seeded_bug_is_caught(bug, tiny_checkpoint, tmp_path, monkeypatch, capsys):
    patches, runs, engine, invariant = BUGS[bug]
    for cls, name, wrong in patches:
        monkeypatch.setattr(cls, name, wrong(getattr(cls, name)))
    llm = LLM(tiny_checkpoint("llama"), trace_out=str(tmp_path), **{**ENGINE, **engine})
    for prompts in runs:
        llm.generate([{"prompt_token_ids": p} for p in prompts],
                     SamplingParams(temperature=0, max_tokens=3 if len(runs) == 1 else 1, ignore_eos=True),
                     use_tqdm=False)
    _, violation = check_trace(str(tmp_path))
    assert violation is not None and violation.invariant == invariant, violation
    assert cli(["traces", "check", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith(f"{invariant}: step {violation.step}")


@pytest.mark.broken_traces
def test_a_block_dropped_but_not_held_is_a_negative_reference_count(recording, tmp_path):
    """A trace in which a request drops a block it does not hold (a double free) stops the loader's
    block replay; check names the rule it breaks."""
    spoilt = False
    for path in sorted(Path(recording.trace_dir).iterdir()):
        documents = [json.loads(line) for line in path.read_text().splitlines()]
        for span in (s for d in documents for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]):
            for attribute in span.get("attributes", []):
                freed = attribute["value"].get("arrayValue", {}).get("values")
                if attribute["key"] == "step.blocks_freed.block_ids" and freed and not spoilt:
                    freed[0], spoilt = {"intValue": "999"}, True
        (tmp_path / path.name).write_text("".join(json.dumps(d) + "\n" for d in documents))
    _, violation = check_trace(str(tmp_path))
    assert violation.invariant == "reference_counts_never_negative" and "block 999" in violation.detail


@pytest.mark.broken_traces
def test_computed_tokens_that_do_not_grow_by_what_ran_are_caught(recording, tmp_path):
    """Step 2's first request said to have computed 12345 tokens before the step, not what it had after
    step 1: ``computed_tokens_grow_by_what_ran`` names the step and the request."""
    for path in sorted(Path(recording.trace_dir).iterdir()):
        documents = [json.loads(line) for line in path.read_text().splitlines()]
        for span in (s for d in documents for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]):
            attributes = {a["key"]: a["value"] for a in span.get("attributes", [])}
            if attributes.get(Attr.STEP_NUMBER) == {"intValue": "2"}:
                attributes[Attr.STEP_REQ_NUM_COMPUTED_TOKENS]["arrayValue"]["values"][0] = {"intValue": "12345"}
                first = attributes[Attr.STEP_REQ_IDS]["arrayValue"]["values"][0]["stringValue"]
        (tmp_path / path.name).write_text("".join(json.dumps(d) + "\n" for d in documents))
    _, violation = check_trace(str(tmp_path))
    assert (violation.invariant, violation.step, violation.request_id) == ("computed_tokens_grow_by_what_ran", 2, first)
    assert "12345 tokens computed before the step" in violation.detail
