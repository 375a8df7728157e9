"""What the traces say about KV blocks, preemption and prefix caching, and the tracing options."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.trace_utils import attrs, block_events, load_spans
from tracevllm import LLM, SamplingParams

PROMPTS = [f"Request number {i} asks the model for a fairly long answer, please." for i in range(4)]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama")


def test_block_accounting_adds_up_under_preemption(checkpoint, tmp_path):
    # 16 blocks of 4 tokens for 4 requests that each grow to ~40 tokens: preemption is certain.
    llm = LLM(checkpoint, dtype="float32", block_size=4, num_gpu_blocks=16, max_model_len=64, trace_out=str(tmp_path))
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    spans = load_spans(tmp_path)

    # Per request: every block reference taken is dropped again by the end.
    requests = [s for s in spans if s["name"] == "scheduler.request"]
    assert len(requests) == 4
    for span in requests:
        taken, dropped = block_events(span)
        assert taken and taken == dropped

    # Preemption is visible: PREEMPTED, then the request is scheduled again (resumed).
    preempted = [s for s in requests if any(e["name"] == "PREEMPTED" for e in s["events"])]
    assert preempted
    for span in preempted:
        names = [e["name"] for e in span["events"]]
        resumed = [attrs(e)["resumed"] for e in span["events"] if e["name"] == "SCHEDULED"]
        assert names.index("PREEMPTED") < len(names) - 1 - names[::-1].index("SCHEDULED") and resumed[-1] is True

    # Per step: replaying the steps' block changes gives every block's reference count; the blocks
    # in use plus the free blocks are all the blocks, at every step.
    steps = sorted((attrs(s) for s in spans if s["name"] == "engine_step"), key=lambda a: a["step.number"])
    refs: Counter = Counter()
    for a in steps:
        refs.update(a.get("step.blocks_allocated.block_ids", []))
        refs.subtract(a.get("step.blocks_freed.block_ids", []))
        assert min(refs.values(), default=0) >= 0
        in_use = sum(1 for n in refs.values() if n > 0)
        assert in_use + a["step.num_free_blocks"] == a["step.num_gpu_blocks"] == 16, a["step.number"]
        assert len(a.get("step.blocks_allocated.block_ids", [])) == sum(a.get("step.blocks_allocated.num", []))
    assert any(a.get("step.blocks_freed.req_ids") for a in steps[:-1])  # preemptions free blocks mid-run


def test_prefix_cache_hit_shows_the_shared_blocks(checkpoint, tmp_path):
    llm = LLM(checkpoint, dtype="float32", block_size=4, trace_out=str(tmp_path))
    params = SamplingParams(temperature=0, max_tokens=2)
    llm.generate(PROMPTS[0], params, use_tqdm=False)
    llm.generate(PROMPTS[0], params, use_tqdm=False)
    first, second = sorted((s for s in load_spans(tmp_path) if s["name"] == "scheduler.request"),
                           key=lambda s: int(s["startTimeUnixNano"]))
    first_blocks = [b for e in first["events"] if e["name"] == "kv.blocks_allocated" for b in attrs(e)["block_ids"]]
    (hit,) = [attrs(e) for e in second["events"] if e["name"] == "kv.prefix_cache_hit"]
    assert hit["num_cached_tokens"] == 4 * len(hit["block_ids"]) > 0
    assert hit["block_ids"] == first_blocks[: len(hit["block_ids"])]


def test_trace_level_request_and_include_text(checkpoint, tmp_path):
    params = SamplingParams(temperature=0, max_tokens=3)
    LLM(checkpoint, dtype="float32", trace_out=str(tmp_path / "request"), trace_level="request",
        trace_include_text=True).generate(PROMPTS[0], params, use_tqdm=False)
    spans = load_spans(tmp_path / "request")
    names = {s["name"] for s in spans}
    assert "scheduler.request" in names and not names & {"engine_step", "schedule", "execute_model"}
    (root,) = [attrs(s) for s in spans if s["name"] == "llm_request"]
    assert root["gen_ai.prompt"] == PROMPTS[0] and len(root["gen_ai.completion"]) == 1

    LLM(checkpoint, dtype="float32", trace_out=str(tmp_path / "step")).generate(PROMPTS[0], params, use_tqdm=False)
    spans = load_spans(tmp_path / "step")
    (root,) = [attrs(s) for s in spans if s["name"] == "llm_request"]
    assert "gen_ai.prompt" not in root and "gen_ai.completion" not in root
    assert root["gen_ai.usage.prompt_tokens"] > 0 and root["gen_ai.usage.completion_tokens"] == 3
    assert "engine_step" in {s["name"] for s in spans}


def test_bad_trace_level_is_a_value_error(checkpoint):
    with pytest.raises(ValueError, match="trace_level"):
        LLM(checkpoint, trace_out="unused", trace_level="everything")
