"""RayDistributedExecutor on a local Ray cluster this test starts: the same greedy tokens as one
process at tensor-parallel size 2, and a killed actor that surfaces as an error within seconds."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tracevllm import LLM, SamplingParams

ray = pytest.importorskip("ray", reason='Ray is an optional extra: pip install -e ".[ray]"')
pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def executor_of(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.model_executor


def test_tp2_on_ray_gives_the_single_process_tokens(local_ray, tiny_checkpoint):
    path = tiny_checkpoint("llama")
    expected = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm = LLM(path, dtype="float32", tensor_parallel_size=2, distributed_executor_backend="ray")
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected
    llm.llm_engine.shutdown()
    assert executor_of(llm).workers == []


def test_a_killed_actor_is_an_error_within_seconds(local_ray, tiny_checkpoint):
    import psutil

    llm = LLM(tiny_checkpoint("llama"), dtype="float32", distributed_executor_backend="ray")
    executor = executor_of(llm)
    pid = ray.get(executor.workers[0].get_pid.remote())
    killed_at = []

    def kill_soon():
        time.sleep(1.0)
        killed_at.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill_soon, daemon=True).start()
    with pytest.raises(RuntimeError, match="Worker-0 .*died"):
        llm.generate(PROMPTS * 4, SamplingParams(max_tokens=5000, ignore_eos=True), use_tqdm=False)
    assert time.monotonic() - killed_at[0] < 10.0
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert executor.workers == []
