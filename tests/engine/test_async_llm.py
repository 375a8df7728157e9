"""AsyncLLM on a tiny checkpoint: streaming, concurrency, aborts, metrics and a dying engine core."""

from __future__ import annotations

import asyncio

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.engine.async_llm import FAN_OUT_CHUNK, AsyncLLM
from tracevllm.engine.exceptions import EngineDeadError, EngineShutdownError
from tracevllm.engine.output_processor import RequestOutputCollector
from tracevllm.outputs import CompletionOutput, RequestOutput
from tracevllm.sampling_params import RequestOutputKind

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3,"]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama")


def run(coro):
    return asyncio.run(coro)


async def collect(engine: AsyncLLM, prompt, params, request_id) -> list[RequestOutput]:
    return [out async for out in engine.generate(prompt, params, request_id)]


async def wait_idle(engine: AsyncLLM, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        stats = engine.stat_loggers[0].last_scheduler_stats
        if stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0 and stats.kv_cache_usage == 0.0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not idle: {engine.stat_loggers[0].last_scheduler_stats}")


def test_concurrent_streams_match_offline(checkpoint):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    expected = LLM(checkpoint, dtype="float32").generate(PROMPTS, params, use_tqdm=False)

    async def main():
        engine = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, dtype="float32"))
        try:
            results = await asyncio.gather(*(collect(engine, p, params, f"r{i}") for i, p in enumerate(PROMPTS)))
            cumulative = await collect(engine, PROMPTS[0], params.clone(output_kind=RequestOutputKind.CUMULATIVE), "c")
            final = await collect(engine, PROMPTS[0], params.clone(output_kind=RequestOutputKind.FINAL_ONLY), "f")
            await wait_idle(engine)
            metrics = engine.prometheus.generate_latest().decode()
        finally:
            engine.shutdown()
        return results, cumulative, final, metrics

    results, cumulative, final, metrics = run(main())
    for outs, want in zip(results, expected):
        assert len(outs) > 1 and outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert [t for o in outs for t in o.outputs[0].token_ids] == want.outputs[0].token_ids
        assert "".join(o.outputs[0].text for o in outs) == want.outputs[0].text
    assert cumulative[-1].outputs[0].text == expected[0].outputs[0].text
    assert [len(o.outputs[0].token_ids) for o in cumulative] == sorted(len(o.outputs[0].token_ids) for o in cumulative)
    assert len(final) == 1 and final[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    assert 'vllm:request_success_total{engine="0",finished_reason="length"' in metrics
    assert 'vllm:generation_tokens_total{engine="0",model_name=' in metrics


def test_closing_the_stream_aborts_the_request(checkpoint):
    async def main():
        engine = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, dtype="float32"))
        try:
            params = SamplingParams(max_tokens=2000, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
            stream = engine.generate(PROMPTS[0], params, "long")
            await anext(stream)
            await stream.aclose()
            assert engine.output_processor.get_num_unfinished_requests() == 0
            await wait_idle(engine)  # 2000 tokens would take far longer: the core aborted it

            task = asyncio.create_task(collect(engine, PROMPTS[1], params, "cancelled"))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_idle(engine)
            # The engine keeps serving, and a request id may be reused once its request is gone.
            outs = await collect(engine, PROMPTS[1], params.clone(max_tokens=3), "long")
            assert outs[-1].finished and sum(len(o.outputs[0].token_ids) for o in outs) == 3
        finally:
            engine.shutdown()

    run(main())


def test_a_large_n_fans_out_in_chunks_and_a_cancel_mid_fan_out_aborts_every_sample(checkpoint):
    async def main():
        engine = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, dtype="float32"))
        try:
            # Samples that would run for 1000 steps each if the cancel left them in the engine core.
            params = SamplingParams(n=2000, max_tokens=1000, ignore_eos=True,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            task = asyncio.create_task(collect(engine, PROMPTS[0], params, "big"))
            while "big" not in engine.output_processor.parent_requests:
                await asyncio.sleep(0)
            parent = engine.output_processor.parent_requests["big"]
            while len(parent.children) < 3 * FAN_OUT_CHUNK:  # this loop runs between the chunks
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert 3 * FAN_OUT_CHUNK <= len(parent.children) < 2000  # cancelled mid-fan-out
            assert not engine.output_processor.parent_requests and not engine.output_processor.request_states
            assert not engine.collectors

            # A request sent after the abort: its last output's stats show what the core holds besides.
            outs = await collect(engine, PROMPTS[1], params.clone(n=3 * FAN_OUT_CHUNK + 5, max_tokens=1), "after")
            assert [o.index for o in outs[-1].outputs] == list(range(3 * FAN_OUT_CHUNK + 5))
            stats = engine.stat_loggers[0].last_scheduler_stats
            assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
            await wait_idle(engine)
        finally:
            engine.shutdown()

    run(main())


def test_bad_request_raises_value_error_and_engine_goes_on(checkpoint):
    async def main():
        engine = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, dtype="float32", max_model_len=64))
        try:
            with pytest.raises(ValueError, match="max_model_len"):
                await collect(engine, list(range(100)), SamplingParams(), "too-long")
            outs = await collect(engine, PROMPTS[0], SamplingParams(max_tokens=2), "ok")
            assert outs[-1].finished
        finally:
            engine.shutdown()

    run(main())


def test_engine_core_death_fails_in_flight_and_new_requests(checkpoint):
    async def main():
        engine = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, dtype="float32"))
        try:
            stream = engine.generate(PROMPTS[0], SamplingParams(max_tokens=2000, ignore_eos=True), "r")
            await anext(stream)
            engine.engine_core.proc_manager.proc.kill()
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    pass
            assert engine.errored
            with pytest.raises(EngineDeadError):
                await collect(engine, PROMPTS[1], SamplingParams(max_tokens=2), "new")
            with pytest.raises(EngineDeadError):
                await engine.check_health()
        finally:
            engine.shutdown()

    run(main())


def test_stop_for_shutdown_ends_streams_aborts_them_and_refuses_new_ones(checkpoint):
    async def main():
        engine = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, dtype="float32"))
        try:
            params = SamplingParams(max_tokens=2000, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
            streams = [engine.generate(PROMPTS[i], params, f"r{i}") for i in range(3)]
            for stream in streams:
                await anext(stream)
            await engine.stop_for_shutdown()
            for stream in streams:
                with pytest.raises(EngineShutdownError, match="shutting down"):
                    async for _ in stream:
                        pass
            with pytest.raises(EngineShutdownError):
                await collect(engine, PROMPTS[1], SamplingParams(max_tokens=2), "new")
            await engine.wait_until_idle(10.0)
            assert not engine.engine_core_busy and not engine.errored  # aborted, not dead
            await wait_idle(engine)  # every block freed
        finally:
            engine.shutdown()

    run(main())


def _output(text: str, token_ids: list[int], finished: bool) -> RequestOutput:
    completion = CompletionOutput(0, text, token_ids, None, None, "length" if finished else None)
    return RequestOutput("r", None, [1], [completion], finished)


def test_collector_merges_deltas_for_a_slow_consumer():
    async def main():
        collector = RequestOutputCollector(RequestOutputKind.DELTA)
        collector.put(_output("a", [1], False))
        collector.put(_output("b", [2], False))
        collector.put(_output("c", [3], True))
        merged = await collector.get()
        assert (merged.outputs[0].text, merged.outputs[0].token_ids, merged.finished) == ("abc", [1, 2, 3], True)

        cumulative = RequestOutputCollector(RequestOutputKind.CUMULATIVE)
        cumulative.put(_output("a", [1], False))
        cumulative.put(_output("ab", [1, 2], False))
        assert (await cumulative.get()).outputs[0].text == "ab"

        failing = RequestOutputCollector(RequestOutputKind.DELTA)
        failing.put(_output("a", [1], False))
        failing.put(EngineDeadError())
        with pytest.raises(EngineDeadError):
            await failing.get()

    run(main())
