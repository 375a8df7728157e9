"""The multi-process engine core: same tokens as in-process, start-up errors surfaced, no orphans,
and nothing left behind (socket files, semaphores) however the client ends."""

from __future__ import annotations

import os

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.engine import EngineCoreRequestType
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
    # The engine core's own exception first, then its traceback.
    with pytest.raises(RuntimeError, match=r"^The engine core failed to start: ValueError: The KV cache holds .*"
                                           r"fewer than max_model_len .*\nTraceback"):
        LLM(checkpoint, dtype="float32", multiprocess=True, num_gpu_blocks_override=1, block_size=16, max_model_len=512)


def test_dead_engine_core_raises_instead_of_hanging(checkpoint):
    llm = LLM(checkpoint, dtype="float32", multiprocess=True)
    proc = llm.llm_engine.engine_core.proc_manager.proc
    proc.kill()
    proc.join(10)
    with pytest.raises(EngineDeadError, match="exited with code"):
        llm.generate(PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)
    llm.llm_engine.shutdown()


def test_a_message_the_engine_core_cannot_read_kills_it_loudly(checkpoint):
    """Not a silent input thread and an engine that waits forever: the core dies with the cause.

    The client finds the process gone before it reads anything (the send of ``generate`` checks first):
    the cause is still the one the engine core sent, not a bare exit code."""
    llm = LLM(checkpoint, dtype="float32", multiprocess=True)
    client = llm.llm_engine.engine_core
    try:
        client._send([EngineCoreRequestType.ADD.value, b"not msgpack for a request"])
        client.proc_manager.proc.join(timeout=30)
        with pytest.raises(EngineDeadError, match="could not read a message from the front end"):
            llm.generate(PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)
    finally:  # a client left to the garbage collector would close its zmq context at some later moment
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


CLIENT_SCRIPT = """
import sys, time
from tracevllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(sys.argv[1], dtype="float32", device="cpu", tensor_parallel_size=2, multiprocess=True)
    llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)
    print("READY", flush=True)
    if sys.argv[2] != "exit":
        time.sleep(600)  # until the test kills this process
"""


@pytest.mark.parametrize("method, ending", [("fork", "exit"), ("fork", "SIGKILL"), ("spawn", "SIGKILL"), ("spawn", "SIGTERM")])
def test_no_socket_file_or_semaphore_is_left_however_the_client_ends(checkpoint, tmp_path, method, ending):
    """The client's socket files are gone once the engine core has connected, and the engine core and
    its workers exit their own way even when the client is killed, so that under spawn their named
    semaphores (the message queue's, tqdm's lock in each worker) are unlinked: nothing is left in
    the run's temp dir, and the resource tracker finds no leak. ``exit``: the script ends without
    shutting the engine down."""
    import signal
    import subprocess
    import sys

    import psutil

    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    env = {**os.environ, "TMPDIR": str(tmp_path), "TRACEVLLM_WORKER_MULTIPROC_METHOD": method}
    proc = subprocess.Popen([sys.executable, str(script), checkpoint, ending], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == "READY\n", proc.communicate()[1][-3000:]
    children = psutil.Process(proc.pid).children(recursive=True)
    assert {"EngineCore", "Worker-0", "Worker-1"} <= {child.name() for child in children}
    assert not list(tmp_path.glob("tracevllm-*"))  # gone already, while everything runs
    if ending != "exit":
        proc.send_signal(getattr(signal, ending))
    _, stderr = proc.communicate(timeout=120)
    _, alive = psutil.wait_procs(children, timeout=30)  # the engine core, its workers, spawn's resource tracker
    assert not [child for child in alive if _running(child)]
    assert not list(tmp_path.glob("tracevllm-*"))
    assert "leaked" not in stderr, stderr[-3000:]


def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
