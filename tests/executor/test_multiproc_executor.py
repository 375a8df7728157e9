"""MultiprocExecutor on CPU: the same tokens as the in-process executor, and failures that surface
as errors within seconds, with no worker process left behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tracevllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def workers_of(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.model_executor.procs


def test_one_worker_process_gives_the_same_tokens(tiny_checkpoint):
    path = tiny_checkpoint("llama")
    expected = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm = LLM(path, dtype="float32", distributed_executor_backend="mp")
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected
    procs = workers_of(llm)
    assert [p.name for p in procs] == ["Worker-0"] and procs[0].is_alive()
    llm.llm_engine.shutdown()
    assert not procs[0].is_alive()


def test_a_worker_killed_mid_generation_is_an_error_within_seconds(tiny_checkpoint):
    # tp=2: when rank 1 dies, rank 0 is left waiting in an all-reduce; it must be stopped too.
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", tensor_parallel_size=2)
    procs = workers_of(llm)
    killed_at = []

    def kill_soon():
        time.sleep(1.0)
        killed_at.append(time.monotonic())
        os.kill(procs[1].pid, signal.SIGKILL)

    threading.Thread(target=kill_soon, daemon=True).start()
    with pytest.raises(RuntimeError, match=r"Worker-1 \(pid \d+\) died with exit code -9"):
        llm.generate(PROMPTS * 4, SamplingParams(max_tokens=5000, ignore_eos=True), use_tqdm=False)
    assert time.monotonic() - killed_at[0] < 5.0
    assert not any(p.is_alive() for p in procs)
    with pytest.raises(RuntimeError, match="died"):  # the engine stays failed, it does not hang
        llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)


def test_a_worker_that_fails_to_start_is_reported_with_its_traceback(tiny_checkpoint, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint("llama"), broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    # The message starts with the worker's own exception, its traceback follows.
    with pytest.raises(RuntimeError, match=r"(?s)^Worker-0 failed: SafetensorError: .*\nTraceback.*load_model"):
        LLM(str(broken), dtype="float32", distributed_executor_backend="mp")


@pytest.mark.parametrize("multiprocess", [False, True])
def test_a_worker_exception_at_start_up_is_named_in_the_error(tiny_checkpoint, monkeypatch, multiprocess):
    """Forked workers (and a forked engine core) run this process's code, patched here to fail in
    the worker only; in the engine-core process, the worker's error becomes the engine core's."""
    from tracevllm.worker.gpu_worker import Worker

    def load_model(self):
        raise ValueError(f"no weights for rank {self.rank}")

    monkeypatch.setenv("TRACEVLLM_WORKER_MULTIPROC_METHOD", "fork")
    monkeypatch.setattr(Worker, "load_model", load_model)
    prefix = "The engine core failed to start: RuntimeError: " if multiprocess else ""
    with pytest.raises(RuntimeError, match=rf"^{prefix}Worker-\d failed: ValueError: no weights for rank \d\n"):
        LLM(tiny_checkpoint("llama"), dtype="float32", device="cpu", tensor_parallel_size=2, multiprocess=multiprocess)
