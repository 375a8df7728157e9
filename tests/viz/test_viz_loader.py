"""``viz.load_trace`` on real traces, checked against what the engine itself knew (tests/viz/conftest.py)."""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from viz import load_trace


@pytest.fixture(scope="module")
def trace(recording):
    return load_trace(recording.trace_dir)


def test_requests_match_the_outputs(recording, trace):
    assert list(trace.requests) == [o.request_id for o in recording.outputs]
    for out in recording.outputs:
        request = trace.requests[out.request_id]
        assert request.num_prompt_tokens == len(out.prompt_token_ids)
        assert request.num_output_tokens == len(out.outputs[0].token_ids)
        assert request.cached_tokens == out.num_cached_tokens
        assert request.finish_reason == "length"
        assert request.ttft is not None and request.e2e >= request.ttft > 0 and request.tpot > 0
        # Every token the request computed is in its chunks: the prompt (less its cache hit) and each
        # output but the last, plus whatever it recomputed after preemptions.
        computed = sum(c.num_tokens for c in request.chunks)
        expected = request.num_prompt_tokens + request.num_output_tokens - 1 - request.cached_tokens
        assert computed >= expected and (computed == expected) == (request.num_preemptions == 0)


def test_preemptions_are_where_the_engine_made_them(recording, trace):
    assert recording.preemptions  # the run is meant to preempt
    for req_id, request in trace.requests.items():
        n = recording.preemptions[req_id]
        assert request.num_preemptions == len(request.preemptions) == n
        assert sum(req_id in s.preempted_req_ids for s in trace.steps) == n
        assert sum(s.kind == "preempted" for s in request.segments) == n
        assert [a.resumed for a in request.admissions] == [False] + [True] * n


def test_segments_cover_each_request_without_gaps(trace):
    for request in trace.requests.values():
        segments = request.segments
        assert segments[0].kind == "queued" and segments[0].start == request.queued
        assert segments[-1].kind == "decode" and segments[-1].end == request.finished
        assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
        assert request.arrival <= request.queued <= request.first_token <= request.finished + 0.1


def test_prefix_cache_hit_is_a_shared_block(recording, trace):
    (out,) = [o for o in recording.outputs if o.num_cached_tokens > 0]
    request = trace.requests[out.request_id]
    (hit,) = request.prefix_hits
    assert hit.num_cached_tokens == out.num_cached_tokens == 4 * len(hit.block_ids)
    (step,) = [s for s in trace.steps if out.request_id in s.prefix_hits]
    assert step.prefix_hits[out.request_id] == hit.block_ids
    assert step.blocks_held[out.request_id][: len(hit.block_ids)] == hit.block_ids
    assert all(len(step.block_owners[b]) == 2 for b in hit.block_ids)


def test_block_tables_are_the_engines(recording, trace):
    """After every step, each request holds exactly the blocks the engine's KVCacheManager gave it,
    in block-table order; blocks in use plus free blocks are all the blocks but the null block; nothing is
    held at the end."""
    assert len(trace.steps) == len(recording.block_tables)
    assert [s.number for s in trace.steps] == list(range(1, len(trace.steps) + 1))
    for step, engine_tables in zip(trace.steps, recording.block_tables):
        assert step.blocks_held == engine_tables, step.number
        assert len(step.block_owners) + step.num_free_blocks + trace.num_null_blocks == step.num_gpu_blocks == 17
        assert 0 not in step.block_owners  # the null block is never held
    assert trace.steps[-1].blocks_held == {}


def test_steps_carry_the_schedule(trace):
    for step in trace.steps:
        assert step.num_prefill_tokens + step.num_decode_tokens == step.num_scheduled_tokens <= step.token_budget == 32
        assert step.start < step.end and step.batch_size == len(step.req_num_tokens)
    # The 32-token budget cut the first prompts (4 x 15 tokens) into chunks.
    assert trace.steps[0].num_scheduled_tokens == 32 and trace.steps[0].batch_size == 3


def test_request_level_trace_has_requests_but_no_steps(request_level_dir):
    trace = load_trace(request_level_dir)
    assert not trace.steps and len(trace.requests) == 2
    for request in trace.requests.values():
        assert request.num_output_tokens == 4 and not request.chunks
        assert [s.kind for s in request.segments] == ["queued", "prefill", "decode"]
    with pytest.raises(ValueError, match="--trace-level request"):
        trace.require_steps()


@pytest.mark.broken_traces
def test_truncated_last_line_is_skipped_with_a_warning(recording, tmp_path):
    for path in glob.glob(f"{recording.trace_dir}/tracevllm-*.jsonl"):
        shutil.copy(path, tmp_path)
    (copy,) = list(tmp_path.iterdir())
    text = copy.read_text()
    copy.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])  # a process killed mid-line
    with pytest.warns(UserWarning, match="unreadable last line"):
        trace = load_trace(str(tmp_path))
    assert trace.spans and len(trace.spans) < len(load_trace(recording.trace_dir).spans)


@pytest.mark.broken_traces
def test_unreadable_middle_line_and_empty_directory_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="no trace files"):
        load_trace(str(tmp_path))
    with pytest.raises(ValueError, match="no such trace directory"):
        load_trace(str(tmp_path / "missing"))
    (tmp_path / "tracevllm-1.jsonl").write_text("{not json\n{}\n")
    with pytest.raises(ValueError, match=r"tracevllm-1.jsonl:1: "):
        load_trace(str(tmp_path))


def test_viz_needs_neither_torch_nor_the_engine():
    """viz reads the trace's names from tracevllm.tracing.schema (which takes the core's stage names from
    tracevllm.core.stages, plain constants) and prices steps with tracevllm.step_cost (numpy only), and
    loads nothing else of tracevllm."""
    code = ("import sys, viz; viz.write_report; viz.write_animation; viz.load_trace; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'tracevllm', 'opentelemetry')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).parents[2])
    assert result.stdout.strip() == str(["tracevllm", "tracevllm.core", "tracevllm.core.stages", "tracevllm.step_cost",
                                          "tracevllm.tracing", "tracevllm.tracing.schema"])


def test_two_processes_and_two_samples_join_into_one_trace(multiprocess_dir):
    trace = load_trace(multiprocess_dir)
    assert {s.process.name for s in trace.spans} == {"MainProcess", "EngineCore"}
    assert {s.process.name for s in trace.spans if s.name in ("engine_step", "scheduler.request")} == {"EngineCore"}
    first, second = trace.requests.values()
    assert first.trace_id == second.trace_id and first.request_id != second.request_id
    for request in (first, second):
        assert request.num_output_tokens == 4 and request.ttft is not None and request.chunks
    assert sum(s.batch_size for s in trace.steps) == sum(len(r.chunks) for r in trace.requests.values())


def test_viz_names_and_submodules_load_on_first_use():
    code = ("import sys, viz; before = 'matplotlib' in sys.modules; viz.animation.render_step; viz.plot_kv_block_map; "
            "print(before, 'matplotlib' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).parents[2])
    assert result.stdout.split() == ["False", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import viz

        viz.nope
