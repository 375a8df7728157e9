"""``viz/workload.py``: a trace carries its workload. Every engine-core request's recorded fields equal
what was submitted (prompt block hashes as the prefix cache makes them, sampling parameters,
priority, n) and what it produced (output length, finish reason); a trace recorded before traces
carried it is refused, saying so."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.core.kv_cache_utils import hash_request_tokens
from tracevllm.outputs import RequestOutput
from tracevllm.tracing.schema import TRACE_FORMAT, Attr
from viz.trace_loader import load_trace
from viz.workload import load_workload, stand_in_prompts

ENGINE = dict(dtype="float32", block_size=4, num_gpu_blocks_override=17, max_model_len=64, max_num_seqs=8,
              max_num_batched_tokens=32)
SHARED = "A shared system prompt: answer briefly and politely."


def _submitted(outputs: list[RequestOutput], params: list[SamplingParams], priorities: list[int],
               block_size: int) -> dict[str, dict]:
    """What each engine-core request was asked and produced, as the engine's outputs tell it (a
    sample of a request with n > 1 is ``{index}_{request id}``)."""
    expected = {}
    for out, p, priority in zip(outputs, params, priorities):
        for sample in out.outputs:
            request_id = out.request_id if p.n == 1 else f"{sample.index}_{out.request_id}"
            expected[request_id] = dict(
                request_id=request_id, parent_request_id=out.request_id, n=p.n,
                num_prompt_tokens=len(out.prompt_token_ids), block_size=block_size,
                prompt_block_hashes=tuple(h.hex() for h in hash_request_tokens(block_size, out.prompt_token_ids)),
                max_tokens=p.max_tokens, min_tokens=p.min_tokens, ignore_eos=p.ignore_eos,
                prompt_logprobs=p.prompt_logprobs is not None, priority=priority,
                num_output_tokens=len(sample.token_ids), finish_reason=sample.finish_reason)
    return expected


def test_the_workload_round_trips(tiny_checkpoint, tmp_path):
    """Priority scheduling, n=2, min_tokens, ignore_eos, prompt logprobs, and prefix caching off (the
    hashes are made for the trace anyway)."""
    engine = {**ENGINE, "scheduling_policy": "priority", "enable_prefix_caching": False}
    llm = LLM(tiny_checkpoint("llama"), trace_out=str(tmp_path), **engine)
    prompts = [SHARED + " Q1?", SHARED + " Q2?", "Short."]
    params = [SamplingParams(temperature=0, max_tokens=6, min_tokens=3),
              SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1)]
    priorities = [2, 0, 1]
    outputs = llm.generate(prompts, params, use_tqdm=False, priority=priorities)

    trace = load_trace(str(tmp_path))
    assert trace.trace_format == TRACE_FORMAT
    workload = load_workload(trace)
    expected = _submitted(outputs, params, priorities, ENGINE["block_size"])
    recorded = {r.request_id: {k: v for k, v in asdict(r).items() if k not in ("arrival", "queued")}
                for r in workload}
    assert recorded == expected
    assert [r.arrival for r in workload] == sorted(r.arrival for r in workload)
    assert all(0 <= r.arrival <= r.queued for r in workload)
    # The shared prompt's first blocks hash alike, in both prompts; both samples have the same hashes.
    q1, q2, q2_again = (recorded[request_id]["prompt_block_hashes"] for request_id in (
        outputs[0].request_id, f"0_{outputs[1].request_id}", f"1_{outputs[1].request_id}"))
    assert q1[0] == q2[0] and q1 != q2 and q2 == q2_again


def test_the_hashes_are_the_prefix_caches_own(recording, request_level_dir, multiprocess_dir):
    """With prefix caching on, the recorded hashes are those the KV cache manager looked up; a request
    -level trace carries the workload too, and so does one whose engine core ran in a process of its own."""
    trace = load_trace(recording.trace_dir)
    by_id = {r.request_id: r for r in load_workload(trace)}
    for out in recording.outputs:
        r = by_id[out.request_id]
        assert r.prompt_block_hashes == tuple(h.hex() for h in hash_request_tokens(4, out.prompt_token_ids))
        assert (r.num_output_tokens, r.finish_reason) == (len(out.outputs[0].token_ids), out.outputs[0].finish_reason)
    request_level = load_workload(load_trace(request_level_dir))
    assert len(request_level) == 2 and all(r.prompt_block_hashes and r.n == 1 for r in request_level)
    first, second = load_workload(load_trace(multiprocess_dir))  # one request, n=2
    assert (first.n, second.n) == (2, 2) and first.parent_request_id == second.parent_request_id
    assert first.prompt_block_hashes == second.prompt_block_hashes and first.request_id != second.request_id


def _shared_blocks(a: tuple | list, b: tuple | list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_stand_in_prompts_hit_the_prefix_cache_as_the_recorded_ones(recording):
    """Hashed by the engine, the stand-ins share exactly the blocks the recorded prompts shared."""
    workload = load_workload(load_trace(recording.trace_dir))
    prompts = stand_in_prompts(workload)
    hashes = {r.request_id: hash_request_tokens(r.block_size, prompts[r.request_id]) for r in workload}
    assert any(_shared_blocks(a.prompt_block_hashes, b.prompt_block_hashes) for a in workload for b in workload
               if a is not b)  # the two requests that share a prompt prefix
    for a in workload:
        assert len(prompts[a.request_id]) == a.num_prompt_tokens
        for b in workload:
            assert (_shared_blocks(hashes[a.request_id], hashes[b.request_id])
                    == _shared_blocks(a.prompt_block_hashes, b.prompt_block_hashes))


def _strip_trace_format(src: str, dst) -> None:
    """``src``'s trace files as a tracevllm from before the trace format wrote them."""
    shutil.copytree(src, dst)
    for path in dst.glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for line in lines:
            for resource_spans in line["resourceSpans"]:
                resource = resource_spans["resource"]
                resource["attributes"] = [a for a in resource["attributes"] if a["key"] != Attr.TRACE_FORMAT]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.broken_traces  # the copy says format 1, yet its blocks start after format 4's null block
def test_an_old_trace_is_refused_with_a_clear_message(recording, tmp_path):
    old = tmp_path / "old"
    _strip_trace_format(recording.trace_dir, old)
    trace = load_trace(str(old))
    assert trace.trace_format == 1 and trace.requests  # it still loads for everything else
    with pytest.raises(ValueError, match=r"recorded before traces carried their workload \(trace format 1, "
                                         r"a replay needs 2 or later"):
        load_workload(trace)
