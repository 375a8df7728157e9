"""EngineCore.step() records one StepRecord per step, timed stage by stage (core/events.py), and
EngineIdle once the last request is done."""

from __future__ import annotations

import time

from tests.core.test_events import Recorded
from tracevllm import LLM, SamplingParams
from tracevllm.core.events import EngineIdle, RequestFinished, StepRecord
from tracevllm.core.stages import STEP_PARTS, STEP_STAGES


def test_each_step_records_its_stages_batch_and_gauges(tiny_checkpoint):
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", num_gpu_blocks_override=64, max_model_len=256)
    recorded = Recorded()
    llm.llm_engine.engine_core.engine_core.recorder.add_observer(recorded)
    start = time.time()
    llm.generate(["one two three", "four five six seven"], SamplingParams(max_tokens=5, ignore_eos=True),
                 use_tqdm=False)
    elapsed = time.time() - start
    records = [e for e in recorded if isinstance(e, StepRecord)]
    assert len(records) == 5  # both prompts in the first step, which samples; then four decodes
    for record in records:
        assert tuple(record.durations) == STEP_STAGES and all(d >= 0 for d in record.durations.values())
        assert start <= record.start_time and record.error is None
        assert [s.is_decode for s in record.batch.scheduled] == [record.step > 1] * 2
        assert record.gauges.num_gpu_blocks == 64
        # The model runner's host parts, each inside its stage (and no device time on CPU).
        for stage, parts in STEP_PARTS.items():
            assert all(record.parts[p] >= 0 for p in parts)
            assert sum(record.parts[p] for p in parts) <= record.durations[stage]
        assert set(record.parts) == {p for parts in STEP_PARTS.values() for p in parts}
        assert record.forward_device_s is None
    assert sum(sum(r.durations.values()) for r in records) <= elapsed
    # Every block is free again but block 0, the null block, which never is.
    assert records[-1].gauges.num_free_blocks == 64 - 1 and records[-1].gauges.num_running_reqs == 0
    assert sum(isinstance(e, RequestFinished) for e in recorded) == 2
    # Nothing left to do after the last step: one EngineIdle, right after its record.
    assert [i for i, e in enumerate(recorded) if isinstance(e, EngineIdle)] == [len(recorded) - 1]
    assert recorded[-2] is records[-1]


def test_unobserved_the_model_runner_laps_nothing(tiny_checkpoint, monkeypatch):
    """With nobody observing, the engine core asks for no host parts (``time_step_parts``): the model
    runner makes no ``LapTimer``, and its laps are the shared no-op."""
    def refuse(*args, **kwargs):
        raise AssertionError("a LapTimer was made with nobody listening")

    monkeypatch.setattr("tracevllm.worker.gpu_model_runner.LapTimer", refuse)
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", num_gpu_blocks_override=64, max_model_len=256)
    outputs = llm.generate(["one two three"], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(outputs[0].outputs[0].token_ids) == 3
