"""Issue 27: one request that fails in the engine core ends alone, with ``FinishReason.ERROR``;
the engine core goes on serving everyone else."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from tracevllm import LLM, SamplingParams
from tracevllm.engine import EngineCoreRequest, FinishReason
from tracevllm.engine.async_llm import AsyncLLM
from tracevllm.engine.exceptions import EngineGenerateError
from tracevllm.engine.output_processor import RequestOutputCollector
from tracevllm.outputs import CompletionOutput, RequestOutput
from tracevllm.sampling_params import RequestOutputKind

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama")


def poison(llm: LLM, bad_id: str) -> None:
    """From now on the request ``bad_id``'s logits row is NaN (as a broken model would make it)."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.worker.model_runner
    sample_tokens = runner.sample_tokens

    def sample_with_nan(model_runner_output):
        if bad_id in model_runner_output.sampling_req_ids:
            with torch.inference_mode():
                model_runner_output.logits[model_runner_output.sampling_req_ids.index(bad_id)] = float("nan")
        return sample_tokens(model_runner_output)

    runner.sample_tokens = sample_with_nan


def run_to_end(llm: LLM) -> dict[str, RequestOutput]:
    engine, finished = llm.llm_engine, {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    return finished


@pytest.mark.parametrize("bad_params", [GREEDY, SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)],
                         ids=["greedy", "random"])
def test_a_request_with_nan_logits_fails_alone(checkpoint, bad_params):
    llm = LLM(checkpoint, dtype="float32", num_gpu_blocks_override=65)  # 64 blocks and the null block
    want = llm.generate(["Once upon a time"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    poison(llm, "bad")
    llm.llm_engine.add_request("bad", "The capital of France is", bad_params)
    llm.llm_engine.add_request("good", "Once upon a time", GREEDY)
    finished = run_to_end(llm)

    bad = finished["bad"].outputs[0]
    assert bad.finish_reason == "error" and "sampler" in bad.stop_reason and bad.token_ids == []
    good = finished["good"].outputs[0]
    assert good.finish_reason == "length" and good.token_ids == want  # the batch it shared is unchanged
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.kv_cache_manager.num_free_blocks == 64 and not scheduler.requests
    # The engine goes on serving.
    assert llm.generate(["Once upon a time"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want


def test_a_duplicate_request_id_fails_alone_in_the_engine_core_process(checkpoint):
    """``EngineCore.add_request`` refuses a duplicate id; in the busy loop that is an ERROR output
    for it, not the end of the engine core."""
    llm = LLM(checkpoint, dtype="float32", multiprocess=True)
    client = llm.llm_engine.engine_core
    try:
        def request(request_id: str) -> EngineCoreRequest:
            return EngineCoreRequest(request_id, [1, 2, 3, 4, 5], GREEDY, None, time.time())

        for request_id in ("dup", "dup", "other"):
            client.add_request(request(request_id))
        outputs = []
        while sum(o.finished for o in outputs) < 3:
            outputs += client.get_output().outputs
        errors = [o for o in outputs if o.finish_reason == FinishReason.ERROR]
        assert [o.request_id for o in errors] == ["dup"] and "already in the engine" in errors[0].stop_reason
        for request_id in ("dup", "other"):  # the original "dup" and "other" run to their end
            mine = [o for o in outputs if o.request_id == request_id and o.finish_reason != FinishReason.ERROR]
            assert sum(len(o.new_token_ids) for o in mine) == 6 and mine[-1].finish_reason == FinishReason.LENGTH
        out = llm.generate(["Once upon a time"], GREEDY, use_tqdm=False)[0].outputs[0]
        assert out.finish_reason == "length" and len(out.token_ids) == 6
    finally:
        llm.llm_engine.shutdown()


def test_core_add_request_refuses_a_duplicate_id(checkpoint):
    core = LLM(checkpoint, dtype="float32").llm_engine.engine_core.engine_core
    request = EngineCoreRequest("x", [1, 2, 3], GREEDY, None, time.time())
    core.add_request(request)
    with pytest.raises(ValueError, match="request_id 'x' is already in the engine"):
        core.add_request(request)


def test_generate_raises_engine_generate_error_on_an_error_finish():
    """AsyncLLM.generate yields the outputs before the error, then raises with the engine's message
    and aborts what is left of the request (the other samples of an n > 1 request)."""
    collector = RequestOutputCollector(RequestOutputKind.DELTA)
    aborted = []

    class FakeEngine:
        async def add_request(self, *args):
            return collector

        async def abort(self, request_id):
            aborted.append(request_id)

    def output(token_ids, finish_reason=None, stop_reason=None):
        sample = CompletionOutput(0, "", token_ids, None, None, finish_reason, stop_reason)
        return RequestOutput("r", "hi", [1], [sample], finished=False)

    async def main():
        seen = []
        generator = AsyncLLM.generate(FakeEngine(), "hi", SamplingParams(n=2), "r")  # type: ignore[arg-type]
        collector.put(output([5]))
        seen.append(await anext(generator))
        collector.put(output([], "error", "the sampler got no valid distribution"))
        with pytest.raises(EngineGenerateError, match="Request r failed in the engine: the sampler got"):
            seen.append(await anext(generator))
        return seen

    seen = asyncio.run(main())
    assert [o.outputs[0].token_ids for o in seen] == [[5]] and aborted == ["r"]
