"""With several ranks, every worker exports its own spans into the engine step's trace: one
``worker.execute_model`` per rank per batch, under the ``engine_step`` that scheduled it, from the
worker's own process (service ``tracevllm.worker``); the replay draws them as the workers' timeline."""

from __future__ import annotations

import dataclasses

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.tracing.schema import Attr, Service, SpanName
from viz.check import no_request_scheduled_while_its_sample_is_in_flight
from viz.check_facts import Facts
from viz.trace_loader import load_trace
from viz.plots import plot_pipeline

pytestmark = pytest.mark.slow


def test_each_rank_exports_its_share_of_each_step(tiny_checkpoint, tmp_path):
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", tensor_parallel_size=2, pipeline_parallel_size=2,
              max_num_seqs=4, max_num_batched_tokens=16, trace_out=str(tmp_path))
    llm.generate(["The capital of France is", "def add(a, b):", "Once upon a time", "Hi"],
                 SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    trace = load_trace(str(tmp_path))  # read while the engine is still up: the workers flushed when it went idle
    steps = {s.span_id: s for s in trace.spans if s.name == SpanName.ENGINE_STEP}
    workers = [s for s in trace.spans if s.name == SpanName.WORKER_EXECUTE_MODEL]
    assert workers and all(s.parent_id in steps and s.trace_id == steps[s.parent_id].trace_id for s in workers)
    assert {s.process.service for s in workers} == {Service.WORKER}
    assert {s.process.name for s in workers} == {f"Worker-{r}" for r in range(4)}
    by_batch: dict[str, set] = {}
    for s in workers:
        by_batch.setdefault(s.parent_id, set()).add(
            (s.attributes[Attr.WORKER_RANK], s.attributes[Attr.WORKER_TP_RANK], s.attributes[Attr.WORKER_PP_RANK]))
    assert all(ranks == {(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)} for ranks in by_batch.values())
    # Stage 1 waits for stage 0's tensors; tensor-parallel ranks all-reduce: both are measured.
    stage1 = [r for r in trace.worker_runs if r.pp_rank == 1]
    assert any(r.recv > 0 for r in stage1) and all(r.comm >= r.recv + r.send for r in trace.worker_runs)
    assert {s.name for s in trace.spans} >= {SpanName.PP_RECV, SpanName.PP_SEND}
    assert len(trace.worker_runs) == len(workers) and {r.step for r in trace.worker_runs} <= {s.number for s in trace.steps}
    figure = plot_pipeline(trace)
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()][0] == "stage 0 · tp 0 (rank 0)"
    # traces check replays the batch queue from these spans (the suite checks the whole trace too):
    # were the first batch's output never applied, the next decodes would run on unknown tokens.
    facts = Facts.of(trace)
    assert next(no_request_scheduled_while_its_sample_is_in_flight(facts), None) is None
    first_applied = min(n for n, stages in facts.stages.items() if "update_from_output" in stages)
    lost = dataclasses.replace(facts, stages={**facts.stages, first_applied: set()})
    assert next(no_request_scheduled_while_its_sample_is_in_flight(lost)).step > first_applied
    llm.llm_engine.shutdown()
