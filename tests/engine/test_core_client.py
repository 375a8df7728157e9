"""The multi-process engine core: same tokens as in-process, start-up errors surfaced, no orphans."""

from __future__ import annotations

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.engine.exceptions import EngineDeadError

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama")


def test_multiprocess_gives_the_same_tokens(checkpoint):
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True, logprobs=2),
              SamplingParams(n=2, temperature=0.8, seed=9, max_tokens=8, stop=["e"])]
    inproc = LLM(checkpoint, dtype="float32").generate(PROMPTS, params, use_tqdm=False)
    llm = LLM(checkpoint, dtype="float32", multiprocess=True)
    try:
        mp = llm.generate(PROMPTS, params, use_tqdm=False)
        again = llm.generate(PROMPTS, params, use_tqdm=False)  # the engine core keeps serving
    finally:
        llm.llm_engine.shutdown()
    flat = lambda outs: [(c.token_ids, c.text, c.finish_reason) for o in outs for c in o.outputs]  # noqa: E731
    assert flat(mp) == flat(inproc) == flat(again)
    # Same tokens and ranks; the values may differ in the last float32 bits (the test process's torch
    # settings are not the fresh engine-core process's).
    for got, want in zip(mp[1].outputs[0].logprobs, inproc[1].outputs[0].logprobs):
        assert {t: lp.rank for t, lp in got.items()} == {t: lp.rank for t, lp in want.items()}
        assert [lp.logprob for lp in got.values()] == pytest.approx([lp.logprob for lp in want.values()], abs=1e-4)


def test_startup_failure_is_reported_with_its_cause(checkpoint):
    with pytest.raises(RuntimeError, match="fewer than max_model_len"):
        LLM(checkpoint, dtype="float32", multiprocess=True, num_gpu_blocks=1, block_size=16, max_model_len=512)


def test_dead_engine_core_raises_instead_of_hanging(checkpoint):
    llm = LLM(checkpoint, dtype="float32", multiprocess=True)
    proc = llm.llm_engine.engine_core.proc_manager.proc
    proc.kill()
    proc.join(10)
    with pytest.raises(EngineDeadError, match="exited with code"):
        llm.generate(PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)
    llm.llm_engine.shutdown()


def test_engine_core_trace_is_complete_when_generate_returns(checkpoint, tmp_path):
    """The engine core flushes its trace file as it goes idle, before the client hears of the last
    finished request: a trace read right after ``generate`` (the process still running) is whole."""
    from tests.trace_utils import load_spans
    from tracevllm.tracing import flush_traces

    llm = LLM(checkpoint, dtype="float32", multiprocess=True, trace_out=str(tmp_path))
    try:
        llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
        flush_traces()
        names = [span["name"] for span in load_spans(tmp_path)]
    finally:
        llm.llm_engine.shutdown()
    assert names.count("scheduler.request") == len(PROMPTS) == names.count("llm_request")
    assert names.count("engine_step") >= 5  # a prefill and four decodes at least
