"""What the traces say: KV blocks, preemption, prefix caching, GenAI attributes, finish reasons, start-up."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from tests.trace_utils import attrs, load_spans, step_block_changes
from tracevllm import LLM, SamplingParams
from tracevllm.attention.ops import cpu_extension
from tracevllm.attention.selector import get_attn_backend
from tracevllm.layers import cpu_norm_act
from tracevllm.optimizations import OptimizationConfig

PROMPTS = [f"Request number {i} asks the model for a fairly long answer, please." for i in range(4)]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama")


def events_of(span: dict) -> list[tuple[str, dict]]:
    return [(e["name"], attrs(e)) for e in span.get("events", [])]


def test_block_accounting_adds_up_under_preemption(checkpoint, tmp_path):
    # 16 blocks of 4 tokens (17 with the null block) for 4 requests that each grow to ~40 tokens:
    # preemption is certain.
    llm = LLM(checkpoint, dtype="float32", block_size=4, num_gpu_blocks_override=17, max_model_len=64,
              trace_out=str(tmp_path))
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    spans = load_spans(tmp_path)

    # Per request: every block reference taken is dropped again by the end.
    requests = [s for s in spans if s["name"] == "scheduler.request"]
    assert len(requests) == 4
    taken, dropped = step_block_changes(spans)
    assert set(taken) == {attrs(s)["request.id"] for s in requests} and taken == dropped

    # Preemption is visible: PREEMPTED (with the blocks it lost), then RESUMED.
    preempted = [s for s in requests if attrs(s)["request.num_preemptions"] > 0]
    assert preempted
    for span in preempted:
        names = [name for name, _ in events_of(span)]
        assert names.index("PREEMPTED") < names.index("RESUMED") < names.index("FINISHED")
        lost = [a["block_ids"] for name, a in events_of(span) if name == "PREEMPTED"]
        assert all(lost)

    # Per step: replaying the steps' block changes gives every block's reference count; the blocks
    # in use plus the free blocks are all the blocks but the null block (block 0), at every step.
    steps = sorted((attrs(s) for s in spans if s["name"] == "engine_step"), key=lambda a: a["step.number"])
    refs: Counter = Counter()
    for a in steps:
        refs.update(a["step.blocks_allocated.block_ids"])
        refs.subtract(a["step.blocks_freed.block_ids"])
        assert min(refs.values(), default=0) >= 0
        in_use = sum(1 for n in refs.values() if n > 0)
        assert in_use + a["step.num_free_blocks"] + 1 == a["step.num_gpu_blocks"] == 17, a["step.number"]
        assert len(a["step.blocks_allocated.block_ids"]) == sum(a["step.blocks_allocated.num"])
    assert any(a["step.preempted_req_ids"] for a in steps)
    assert any(a["step.blocks_freed.req_ids"] for a in steps[:-1])  # preemptions free blocks mid-run


def test_prefix_cache_hit_shows_the_shared_blocks(checkpoint, tmp_path):
    llm = LLM(checkpoint, dtype="float32", block_size=4, trace_out=str(tmp_path))
    params = SamplingParams(temperature=0, max_tokens=2)
    llm.generate(PROMPTS[0], params, use_tqdm=False)
    llm.generate(PROMPTS[0], params, use_tqdm=False)
    spans = load_spans(tmp_path)
    first, second = sorted((s for s in spans if s["name"] == "scheduler.request"),
                           key=lambda s: int(s["startTimeUnixNano"]))
    first_blocks = dict(events_of(first))["SCHEDULED"]["block_ids"]
    hit = dict(events_of(second))["SCHEDULED"]
    assert hit["num_computed_tokens"] == 4 * len(hit["cached_block_ids"]) > 0
    assert hit["cached_block_ids"] == first_blocks[: len(hit["cached_block_ids"])]
    assert attrs(second)["request.num_cached_tokens"] == hit["num_computed_tokens"]
    # The step that admitted the second request lists the hit, and the blocks the first one stored.
    steps = [attrs(s) for s in spans if s["name"] == "engine_step"]
    assert any(a["step.prefix_hits.block_ids"] == hit["cached_block_ids"] for a in steps)
    stored = [b for a in steps for b in a["step.blocks_stored.block_ids"]]
    assert set(hit["cached_block_ids"]) <= set(stored)


def test_genai_attributes_on_completion_and_chat(checkpoint, tmp_path):
    llm = LLM(checkpoint, dtype="float32", trace_out=str(tmp_path), trace_include_text=True)
    params = SamplingParams(temperature=0, max_tokens=3)
    llm.generate(PROMPTS[0], params, use_tqdm=False)
    llm.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}], params,
             use_tqdm=False)
    spans = load_spans(tmp_path)
    completion, chat = sorted((s for s in spans if s["name"] == "llm_request"),
                              key=lambda s: int(s["startTimeUnixNano"]))
    for span, operation in ((completion, "text_completion"), (chat, "chat")):
        a = attrs(span)
        assert a["gen_ai.operation.name"] == operation and a["gen_ai.provider.name"] == "tracevllm"
        assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == checkpoint
        assert a["gen_ai.usage.output_tokens"] == a["gen_ai.usage.completion_tokens"] == 3
        assert a["gen_ai.usage.input_tokens"] == a["gen_ai.usage.prompt_tokens"] > 0
        assert a["gen_ai.usage.cache_read.input_tokens"] == 0
        (output,) = json.loads(a["gen_ai.output.messages"])
        assert output["role"] == "assistant" and output["parts"][0]["type"] == "text"
        assert output["finish_reason"] == "length"
    assert json.loads(attrs(completion)["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": PROMPTS[0]}]}
    ]
    assert json.loads(attrs(chat)["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Hi there"}]}
    ]
    assert json.loads(attrs(chat)["gen_ai.system_instructions"]) == [{"type": "text", "content": "Be brief."}]
    # Only the LLM call carries gen_ai.* keys.
    for span in spans:
        if span["name"] != "llm_request":
            assert not [k for k in attrs(span) if k.startswith("gen_ai.")], span["name"]


def test_a_stop_string_reads_stop_everywhere(checkpoint, tmp_path):
    import viz

    llm = LLM(checkpoint, dtype="float32", trace_out=str(tmp_path / "trace"))
    free_run = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    stop = free_run[0].outputs[0].text[4:9]  # a piece of what the model will write again
    (out,) = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=12, stop=[stop]), use_tqdm=False)
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    spans = load_spans(tmp_path / "trace")
    stopped = max((s for s in spans if s["name"] == "scheduler.request"), key=lambda s: int(s["startTimeUnixNano"]))
    assert attrs(stopped)["request.finish_reason"] == "stop"
    assert dict(events_of(stopped))["FINISHED"]["finish_reason"] == "stop"
    root = next(s for s in spans if s["spanId"] == stopped["parentSpanId"])
    assert attrs(root)["gen_ai.response.finish_reasons"] == ["stop"]
    trace = viz.load_trace(str(tmp_path / "trace"))
    assert [r.finish_reason for r in trace.requests.values()] == ["length", "stop"]
    viz.write_report(str(tmp_path / "trace"), str(tmp_path / "report"))
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.count("<td>stop</td>") == 1 and "<td>abort</td>" not in html


def test_start_up_is_a_trace(checkpoint, tmp_path):
    scheduler = LLM(checkpoint, dtype="float32", trace_out=str(tmp_path),
                    num_gpu_blocks_override=80).llm_engine.vllm_config.scheduler_config
    spans = load_spans(tmp_path)
    by_name = {s["name"]: s for s in spans}
    root = by_name["Overall Loading"]
    assert not root.get("parentSpanId")
    for name, parent in [("Create engine config", "Overall Loading"), ("Load tokenizer", "Overall Loading"),
                         ("Start engine core", "Overall Loading"), ("EngineCore init", "Start engine core"),
                         ("Load model", "EngineCore init"), ("Allocate KV cache", "EngineCore init"),
                         ("Warmup", "EngineCore init"), ("Profile steps", "EngineCore init")]:
        span = by_name[name]
        assert span["traceId"] == root["traceId"] and span["parentSpanId"] == by_name[parent]["spanId"], name
    assert attrs(by_name["Allocate KV cache"])["kv_cache.num_gpu_blocks"] == 80
    assert attrs(by_name["Allocate KV cache"])["kv_cache.enable_prefix_caching"] is True
    # The scheduler's whole configuration, as built: what traces whatif replays a run from.
    init = attrs(by_name["EngineCore init"])
    assert init == {"scheduler.max_num_seqs": scheduler.max_num_seqs, "scheduler.policy": "fcfs",
                    "scheduler.max_num_batched_tokens": scheduler.max_num_batched_tokens,
                    "scheduler.max_model_len": scheduler.max_model_len, "scheduler.enable_chunked_prefill": True,
                    "scheduler.long_prefill_token_threshold": 0, "scheduler.reserve_full_isl": True,
                    "scheduler.watermark": 0.0, "scheduler.async_scheduling": False, "engine": "tracevllm 0.1.0"}
    assert attrs(by_name["Load model"])["cpu.threads"] == torch.get_num_threads()  # chosen at start-up
    # The attention backend, and on CPU the ops it chose (both from this test's environment)
    backend = attrs(by_name["Load model"])["attention.backend"]
    if get_attn_backend(None, torch.device("cpu")).name == "cpu":
        assert backend.startswith("cpu (decode: ") and ", prefill: " in backend
    else:
        assert backend == "torch"  # TRACEVLLM_DISABLE_OPTIMIZATIONS=all
    assert "scheduler.max_num_batched_tokens" not in attrs(by_name["Warmup"])  # offline keeps vLLM's budget
    # The step timed at a ladder of shapes (engine/step_profile.py), for traces fit and whatif: prompt
    # chunks up to what a step may hold, decode batches up to what may run together.
    profile = attrs(by_name["Profile steps"])
    longest = min(256, scheduler.max_num_batched_tokens, scheduler.max_model_len - 1)
    assert profile["profile.prefill_tokens"] == [n for n in (16, 64) if n < longest] + [longest]
    assert profile["profile.decode_rows"] == [n for n in (1, 4, 16, 64) if n <= scheduler.max_num_seqs]
    assert all(s > 0 for s in profile["profile.prefill_seconds"] + profile["profile.decode_seconds"])
    assert by_name["EngineCore init"]["resource"]["service.name"] == "tracevllm.engine_core"
    assert root["resource"]["service.name"] == "tracevllm"


def test_a_run_traced_without_its_steps_profiles_none(checkpoint, tmp_path):
    """The profile is for the what-if, which needs the steps: a request-level trace skips it."""
    LLM(checkpoint, dtype="float32", trace_out=str(tmp_path), trace_level="request")
    names = {s["name"] for s in load_spans(tmp_path)}
    assert "Warmup" in names and "Profile steps" not in names


def test_start_up_shows_what_it_built_or_loaded_once(checkpoint, tmp_path, monkeypatch):
    """Each C++ op is a span inside the phase that loaded it, marked cached when it came from the
    machine's build cache (here: built by an earlier engine of this run, or of an earlier run)."""
    monkeypatch.setattr(cpu_extension, "_loaded", {})  # as in a new process: the ops load again
    LLM(checkpoint, dtype="float32", trace_out=str(tmp_path))
    spans = load_spans(tmp_path)
    by_id = {s["spanId"]: s for s in spans}
    ops = {s["name"]: s for s in spans if s["name"].startswith("C++ op ")}
    if not (OptimizationConfig.from_names().enabled("cpu_norm_act") and cpu_norm_act.load()):
        assert "C++ op cpu_norm_act" not in ops  # TRACEVLLM_DISABLE_OPTIMIZATIONS=all, or no compiler
        return
    assert "C++ op cpu_norm_act" in ops
    for span in ops.values():
        assert by_id[span["parentSpanId"]]["name"] == "Load model"
        assert attrs(span)["one_time.cached"] is True


def test_trace_level_request(checkpoint, tmp_path):
    params = SamplingParams(temperature=0, max_tokens=3)
    LLM(checkpoint, dtype="float32", trace_out=str(tmp_path), trace_level="request").generate(
        PROMPTS[0], params, use_tqdm=False)
    spans = load_spans(tmp_path)
    names = {s["name"] for s in spans}
    assert "scheduler.request" in names and not names & {"engine_step", "schedule", "execute_model"}
    (root,) = [attrs(s) for s in spans if s["name"] == "llm_request"]
    assert "gen_ai.input.messages" not in root and "gen_ai.output.messages" not in root  # no text by default
    assert root["gen_ai.usage.prompt_tokens"] > 0 and root["gen_ai.usage.completion_tokens"] == 3


def test_bad_trace_level_is_a_value_error(checkpoint):
    with pytest.raises(ValueError, match="trace_level"):
        LLM(checkpoint, trace_out="unused", trace_level="everything")


def test_a_long_request_keeps_a_short_trace(checkpoint, tmp_path):
    """512 output tokens: the same spans as for 8, a handful of events, and the steps as ranges."""
    LLM(checkpoint, dtype="float32", trace_out=str(tmp_path), max_model_len=1024).generate(
        PROMPTS[0], SamplingParams(max_tokens=512, ignore_eos=True), use_tqdm=False)
    spans = load_spans(tmp_path)
    (root,) = [s for s in spans if s["name"] == "llm_request"]
    in_trace = sorted(s["name"] for s in spans if s["traceId"] == root["traceId"])
    assert in_trace == ["decode", "detokenize", "llm_request", "prefill", "scheduler.request", "tokenize"]
    assert sum(len(s.get("events", [])) for s in spans if s["traceId"] == root["traceId"]) <= 6
    (sched,) = [attrs(s) for s in spans if s["name"] == "scheduler.request"]
    assert (sched["request.steps"], sched["request.num_steps"]) == ("1-512", 512)
    (detokenize,) = [attrs(s) for s in spans if s["name"] == "detokenize"]
    assert detokenize["detokenize.num_tokens"] == 512


def test_a_step_trace_carries_the_host_parts_within_their_stages(checkpoint, tmp_path):
    """``execute_model`` and ``sample`` have the model runner's host parts as children, in order, and
    they add up to no more than their stage (``traces check``: host_parts_fit_in_their_stage)."""
    from tracevllm.core.stages import STEP_PARTS

    llm = LLM(checkpoint, dtype="float32", max_model_len=64, trace_out=str(tmp_path))
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    spans = load_spans(tmp_path)
    steps = {s["spanId"] for s in spans if s["name"] == "engine_step"}
    stages = [s for s in spans if s.get("parentSpanId") in steps and s["name"] in STEP_PARTS]
    assert len(stages) == 2 * len(steps) == 6
    for stage in stages:
        parts = sorted((s for s in spans if s.get("parentSpanId") == stage["spanId"]),
                       key=lambda s: int(s["startTimeUnixNano"]))
        assert tuple(s["name"] for s in parts) == STEP_PARTS[stage["name"]]
        assert parts[0]["startTimeUnixNano"] == stage["startTimeUnixNano"]
        assert int(parts[-1]["endTimeUnixNano"]) <= int(stage["endTimeUnixNano"])
