"""``async_scheduling``: the engine core schedules each step before the last one's tokens are back
(``AsyncScheduler``, two batches in flight). The model sees the same tokens: greedy outputs are those of
the synchronous engine, preemptions included; the trace says it ran asynchronously and holds the
engine's invariants (checked by the autouse fixture)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.core.test_events import Recorded
from tests.trace_utils import attrs, load_spans
from tracevllm import LLM, SamplingParams
from tracevllm.core.events import OneTimeCost, StepRecord
from tracevllm.core.sched.async_scheduler import AsyncScheduler
from tracevllm.tracing.schema import Attr, SpanName
from viz.check import no_request_scheduled_while_its_sample_is_in_flight
from viz.check_facts import Facts
from viz.trace_loader import load_trace

PROMPTS = [[1 + (i * 13 + j) % 400 for j in range(5 + 7 * i)] for i in range(12)]
PARAMS = [SamplingParams(max_tokens=5 + 3 * i, temperature=0, ignore_eos=i % 2 == 0) for i in range(12)]
# A KV cache of 11 usable blocks of 16 tokens for 12 requests, 4 at a time: some are preempted.
SMALL = dict(dtype="float32", max_num_seqs=4, max_num_batched_tokens=32, num_gpu_blocks_override=12, block_size=16,
             max_model_len=160)


def _generate(model: str, **kwargs) -> list[list[int]]:
    llm = LLM(model, **SMALL, **kwargs)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_greedy_outputs_are_the_synchronous_engines_preemptions_included(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("llama")
    asynchronous = _generate(model, async_scheduling=True, trace_out=str(tmp_path))
    assert asynchronous == _generate(model)
    spans = load_spans(tmp_path)
    init = next(attrs(s) for s in spans if s["name"] == SpanName.ENGINE_CORE_INIT)
    assert init[Attr.ASYNC_SCHEDULING] is True
    requests = [attrs(s) for s in spans if s["name"] == "scheduler.request"]
    assert len(requests) == 12 and any(r["request.num_preemptions"] > 0 for r in requests)


def test_the_engine_core_keeps_two_batches_in_flight(tiny_checkpoint):
    llm = LLM(tiny_checkpoint("llama"), **SMALL, async_scheduling=True)
    core = llm.llm_engine.engine_core.engine_core
    assert isinstance(core.scheduler, AsyncScheduler)
    assert core.batch_queue_size == 2 and core.step_fn == core.step_with_batch_queue


def test_a_one_time_cost_is_recorded_in_the_step_whose_forward_paid_it(tiny_checkpoint):
    """The third batch's forward pays a one-time cost. In one process it runs as the third call hands
    it over, though that call applies the second batch's output and the third's comes a call later:
    the cost belongs to step 3 (``traces explain`` charges a slow step to it by name), once."""
    llm = LLM(tiny_checkpoint("llama"), **SMALL, async_scheduling=True)
    core = llm.llm_engine.engine_core.engine_core
    worker, calls = core.model_executor.worker, []
    execute_model = worker.execute_model

    def paying(scheduler_output):
        output = execute_model(scheduler_output)
        calls.append(scheduler_output)
        if len(calls) == 3:
            output.one_time_costs = [OneTimeCost("torch.compile of something", 1.0, 2.0, False)]
        return output

    worker.execute_model = paying
    recorded = Recorded()
    core.recorder.add_observer(recorded)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], PARAMS[:4], use_tqdm=False)
    costs = [i for i, e in enumerate(recorded) if isinstance(e, OneTimeCost)]
    assert len(costs) == 1
    assert next(e for e in recorded[costs[0]:] if isinstance(e, StepRecord)).step == 3


@pytest.mark.slow
def test_tensor_parallel_ranks_sample_the_placeholders_tokens(tiny_checkpoint, tmp_path):
    """Two ranks in processes of their own: each batch is sent before the last one's tokens are back,
    and every rank fills the placeholders with the token it sampled itself. ``traces check`` replays the
    batches in flight from the workers' spans: a request is scheduled on one placeholder at most (the
    synchronous rule, none, is broken: the batches did overlap)."""
    model = tiny_checkpoint("llama")
    assert _generate(model, async_scheduling=True, tensor_parallel_size=2, distributed_executor_backend="mp",
                     trace_out=str(tmp_path)) == _generate(model)
    facts = Facts.of(load_trace(str(tmp_path)))
    assert next(no_request_scheduled_while_its_sample_is_in_flight(facts), None) is None
    synchronous = dataclasses.replace(facts, startup={**facts.startup, Attr.ASYNC_SCHEDULING: False})
    assert next(no_request_scheduled_while_its_sample_is_in_flight(synchronous), None) is not None


def test_with_pipeline_parallelism_it_is_refused_before_anything_starts(tiny_checkpoint):
    with pytest.raises(ValueError, match="async_scheduling does not run with pipeline parallelism"):
        LLM(tiny_checkpoint("llama"), async_scheduling=True, pipeline_parallel_size=2)
