"""The live page on a running vLLM (``TRACEVLLM_LIVE_PORT``, ``tracevllm/vllm/live.py``): one ``vllm serve``
of the bundled model with the recorder and a live port serves every case, in order:
- a client connecting while vLLM idles gets its ``Hello`` at once (vLLM's sizes, ``source`` "live", an
  empty snapshot), then every step and every request event of a few completions, steps without gaps;
- a client joining mid-run (no session open before it) starts from a snapshot of vLLM's scheduler that
  the events after it account for: every block freed was held, every request finishing was known;
- ``GET /ui`` is served, and draws the run in a real browser;
- SIGTERM to the server: an open stream hears the shutdown's ``EngineIdle``, then ends; the side server
  process is gone and its port free. Bad ``TRACEVLLM_LIVE_PORT`` values are ``test_tracing_scheduler.py``'s.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import openai
import psutil
import pytest

from tests.entrypoints.openai.test_engine_events_stream import (
    EventStream, assert_life_in_order, assert_snapshot_accounts_for_every_block, assert_steps_without_gaps,
    request_events,
)
from tests.server_utils import free_port
from tests.vllm.test_tracing_scheduler import VLLM_PYTHON, pytestmark  # noqa: F401  (the same skip)
from tests.vllm.test_vllm_serve import _wait_healthy
from viz.check import check_trace

MAX_NUM_SEQS = 4


@pytest.fixture(scope="module")
def live_vllm(bundled_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_live")
    trace_dir, port, live_port = tmp / "trace", free_port(), free_port()
    env = {**os.environ, "TRACEVLLM_TRACE_DIR": str(trace_dir), "TRACEVLLM_LIVE_PORT": str(live_port),
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "tracevllm.vllm", "serve", bundled_model_dir, "--port", str(port), "--dtype", "float32",
         "--served-model-name", "smol", "--scheduler-cls", "tracevllm.vllm.TracingScheduler",
         "--no-async-scheduling", "--enforce-eager", "--max-model-len", "1024", "--max-num-batched-tokens", "256",
         "--max-num-seqs", str(MAX_NUM_SEQS), "--shutdown-timeout", "120"],
        env=env, stdout=open(tmp / "serve.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    try:
        _wait_healthy(client, proc)
        yield SimpleNamespace(proc=proc, client=client, port=live_port, api_port=port, trace_dir=trace_dir,
                              log=tmp / "serve.log")
    finally:
        if proc.poll() is None:  # a test failed before the last one stopped it: its trace still whole
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def completions(live_vllm, num: int, max_tokens: int, words: int = 8) -> threading.Thread:
    """``num`` completions at once, on a thread (started); their response ids go to ``thread.ids``."""
    ids: list[str] = []

    def one(i: int) -> None:
        try:
            response = live_vllm.client.completions.create(
                model="smol", prompt=f"Tell me about the number {i}. " * words, max_tokens=max_tokens,
                temperature=0, extra_body={"ignore_eos": True})
            ids.append(response.id)
        except openai.APIError:
            pass  # the server stopped under it (the last test): ids says which ones answered

    def all_of_them() -> None:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(num)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    thread = threading.Thread(target=all_of_them)
    thread.ids = ids
    thread.start()
    return thread


def side_servers(proc: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(proc.pid).children(recursive=True)
            if any("live_server.py" in part for part in p.cmdline())]


def test_a_client_of_an_idle_vllm_gets_its_hello_then_every_event(live_vllm):
    start = time.monotonic()
    stream = EventStream(live_vllm, api_key=None)
    stream.wait_for(lambda ms: ms, timeout=10)
    assert time.monotonic() - start < 2.0  # vLLM idles, its busy loop blocked: the control thread answers
    hello = stream.messages[0]
    assert hello["type"] == "Hello" and hello["source"] == "live" and hello["model"] == "smol"
    assert (hello["max_num_seqs"], hello["max_num_batched_tokens"]) == (MAX_NUM_SEQS, 256)
    assert hello["num_gpu_blocks"] > 0 and hello["block_size"] == 128 and hello["num_null_blocks"] == 1  # vLLM-CPU's
    assert hello["snapshot"]["requests"] == [] and hello["step"] >= -1

    load = completions(live_vllm, 6, 16)
    load.join()
    engine_ids = {f"{i}-0" for i in load.ids}
    stream.wait_for(lambda ms: {m["request_id"] for m in ms if m["type"] == "RequestFinished"} >= engine_ids)
    stream.wait_for(lambda ms: ms[-1]["type"] == "EngineIdle")
    messages = list(stream.messages)
    stream.close()
    records = assert_steps_without_gaps(messages[1:], hello["step"])
    lives = request_events(messages)
    assert set(lives) == engine_ids
    for request_id, events in lives.items():
        assert_life_in_order(request_id, events)
    assert_snapshot_accounts_for_every_block(messages)
    assert {s["request_id"] for r in records if r["batch"] for s in r["batch"]["scheduled"]} == engine_ids
    assert records[-1]["gauges"]["num_running_reqs"] == 0 and records[-1]["gauges"]["kv_cache_usage"] == 0.0


def test_a_client_joining_mid_run_starts_from_a_snapshot_of_vllm(live_vllm):
    """No session is open when the load starts: the client that joins opens one mid-step or between
    steps, and its snapshot holds vLLM's queue (more requests than ``--max-num-seqs``) and batch."""
    load = completions(live_vllm, 12, 48, words=20)
    first = EventStream(live_vllm, "types=StepRecord", api_key=None)  # watches, only to see the run under way
    first.wait_for(lambda ms: sum(m["type"] == "StepRecord" for m in ms) >= 3)
    first.close()
    time.sleep(0.3)  # the session stops: the next client opens a new one, with a snapshot
    stream = EventStream(live_vllm, api_key=None)
    load.join()
    stream.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
    messages = list(stream.messages)
    stream.close()
    snapshot = assert_snapshot_accounts_for_every_block(messages)
    statuses = [r["status"] for r in snapshot["requests"]]
    assert "running" in statuses and "waiting" in statuses, statuses
    assert statuses == sorted(statuses, key=lambda status: status == "running")  # the queue, then the batch
    engine_ids = {f"{i}-0" for i in load.ids}
    assert {r["request_id"] for r in snapshot["requests"]} <= engine_ids  # the trace's ids, not vLLM's own
    running = [r for r in snapshot["requests"] if r["status"] == "running"]
    assert all(r["block_ids"] and r["num_computed_tokens"] > 0 for r in running)
    assert all(r["trace_headers"]["traceparent"] for r in snapshot["requests"])
    assert any(r["waiting"] is not None for r in snapshot["requests"] if r["status"] == "waiting")
    finished = {m["request_id"] for m in messages if m["type"] == "RequestFinished"}
    assert finished == {r["request_id"] for r in snapshot["requests"]} | {
        m["request_id"] for m in messages if m["type"] == "RequestQueued"}


def test_the_page_is_served(live_vllm):
    status, body = get(live_vllm.port, "/ui")
    assert status == 200 and b"<html" in body.lower()
    assert get(live_vllm.port, "/ui/palette.css")[0] == 200 and get(live_vllm.port, "/health")[0] == 200
    status, body = get(live_vllm.port, "/v1/engine/events?types=NoSuchEvent")
    assert status == 400 and b"NoSuchEvent" in body


def _text(browser, element_id: str) -> str:
    return browser.execute_script(f"return document.getElementById({element_id!r}).textContent")


def _attribute(browser, element_id: str, name: str) -> str:
    return browser.execute_script(f"return document.getElementById({element_id!r}).getAttribute({name!r})")


def test_the_page_draws_vllm_s_run(live_vllm, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")
    browser.get(f"http://127.0.0.1:{live_vllm.port}/ui")
    WebDriverWait(browser, 30).until(lambda b: _text(b, "status").startswith("connected"))
    assert _text(browser, "source") == "live"
    load = completions(live_vllm, 8, 32)
    most_running = most_waiting = 0
    while load.is_alive():
        most_running = max(most_running, int(_attribute(browser, "running", "data-count") or 0))
        most_waiting = max(most_waiting, int(_attribute(browser, "waiting", "data-count") or 0))
        time.sleep(0.02)
    WebDriverWait(browser, 30).until(lambda b: _text(b, "status").endswith("idle"))
    assert most_running == MAX_NUM_SEQS and most_waiting > 0, (most_running, most_waiting)
    assert _attribute(browser, "requests-summary", "data-total") == "8"
    assert _attribute(browser, "requests-summary", "data-unfinished") == "0"
    assert _attribute(browser, "kv-legend", "data-in-use") == "0"
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors
    browser.get("about:blank")  # the page's stream ends: the session stops


def test_stopping_vllm_ends_the_streams_and_the_side_server(live_vllm):
    servers = side_servers(live_vllm.proc)
    assert len(servers) == 1, servers
    stream = EventStream(live_vllm, "types=EngineIdle,RequestFinished", api_key=None)
    stream.wait_for(lambda ms: ms)
    # Running when the server is told to stop: vLLM finishes them (past --shutdown-timeout it would kill
    # its engine core, and vLLM-CPU 0.32's API server then does not exit, with or without the recorder).
    load = completions(live_vllm, 2, 200)
    time.sleep(1.5)  # the long ones under way
    live_vllm.proc.send_signal(signal.SIGTERM)
    assert live_vllm.proc.wait(timeout=300) == 0
    assert stream.ended.wait(10), "the stream did not end"
    last = stream.messages[-1]
    assert (last["type"], last["shutdown"]) == ("EngineIdle", True), stream.messages[-3:]
    assert sum(m["type"] == "RequestFinished" for m in stream.messages) == 2  # finished, or aborted at the deadline
    gone, alive = psutil.wait_procs(servers, timeout=10)
    assert not alive, alive
    with socket.socket() as s:  # nothing listens on the port any more (its closed connections may linger)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", live_vllm.port))
    load.join(timeout=30)
    trace, violation = check_trace(str(live_vllm.trace_dir))
    assert violation is None, violation
