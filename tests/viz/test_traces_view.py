"""``tracevllm traces view``: the live page (``/ui``) on a recorded run, in a real headless Chromium
(tests/conftest.py's ``browser``), and the stream it reads, replayed from the trace.

The run is the viz tests' (tests/viz/conftest.py): four long requests that preempt each other in 16
KV blocks, then two that share a prompt prefix. Replayed as fast as the page reads, the page ends on
the trace's last step with every request finished and no block in use, only the shared prompt's
blocks still cached; stepping back through the buffered steps finds requests running and waiting.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.server_utils import free_port
from tracevllm.entrypoints.cli import main as cli
from viz.explain import page_labels
from viz.trace_loader import load_trace
from viz.palette import PHASE_COLOURS

pytestmark = pytest.mark.slow

JAEGER = "http://jaeger.example:16686"


@contextmanager
def traces_view(trace_dir: str, *flags: str) -> Iterator[int]:
    """``tracevllm traces view`` in a subprocess, until ``/health`` answers; yields its port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tracevllm.entrypoints.cli", "traces", "view", trace_dir,
                             "--port", str(port), *flags], stdout=subprocess.PIPE, text=True)
    try:
        assert f"open http://127.0.0.1:{port}/ui" in proc.stdout.readline()
        deadline = time.time() + 60
        while not _healthy(port):
            assert proc.poll() is None and time.time() < deadline, "traces view did not start"
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def _messages(port: int, query: str, until) -> list[dict]:
    """The stream's messages until ``until(message)`` is true (the stream itself never ends)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/v1/engine/events{query}")
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
    messages = []
    while True:
        line = response.readline().decode()
        if line.startswith("data: "):
            messages.append(json.loads(line[6:]))
            if until(messages[-1]):
                conn.close()
                return messages


@pytest.fixture(scope="module")
def trace(recording):
    return load_trace(recording.trace_dir)


def test_the_stream_replays_the_trace_at_the_speed_asked(recording, trace):
    last = trace.steps[-1].number
    recorded_s = trace.steps[-1].end - trace.steps[0].start
    with traces_view(recording.trace_dir, "--speed", "0.5") as port:
        started = time.perf_counter()
        records = _messages(port, "?types=StepRecord", lambda m: m.get("step") == last)
        elapsed = time.perf_counter() - started
        hello, *records = records
        assert hello["type"] == "Hello" and hello["source"] == "trace" and hello["step"] == -1
        assert (hello["num_gpu_blocks"], hello["block_size"], hello["max_num_seqs"]) == (17, 4, 8)
        assert hello["num_null_blocks"] == 1  # block 0, in a trace of format 4
        assert [m["step"] for m in records] == list(range(1, last + 1))  # numbered without gaps
        assert elapsed >= 0.9 * recorded_s / 0.5  # half the recorded pace
        # One request's events, and the steps that ran it.
        request_id = next(iter(trace.requests))
        steps = [s.number for s in trace.steps if request_id in (*s.req_ids, *s.preempted_req_ids)]
        mine = _messages(port, f"?request_id={request_id}", lambda m: m.get("step") == steps[-1])[1:]
        assert mine[0]["type"] == "RequestQueued" and {m.get("request_id", request_id) for m in mine} == {request_id}
        assert "RequestFinished" in {m["type"] for m in mine}
        assert [m["step"] for m in mine if m["type"] == "StepRecord"] == steps
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/engine/events?types=StepRecords")
        assert conn.getresponse().status == 400


def test_speed_must_be_positive_or_max(recording, capsys):
    assert cli(["traces", "view", recording.trace_dir, "--speed", "0"]) == 2
    assert "--speed must be a positive number" in capsys.readouterr().err


def _page(browser, name: str):
    return browser.execute_script(f"return document.getElementById({name!r})")


def test_the_page_replays_a_recorded_run(recording, trace, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    last = trace.steps[-1]
    with traces_view(recording.trace_dir, "--speed", "max", "--jaeger-url", JAEGER) as port:
        browser.get_log("browser")  # forget what earlier tests left in the console
        browser.get(f"http://127.0.0.1:{port}/ui")
        WebDriverWait(browser, 60).until(lambda b: _page(b, "step").text == str(last.number)
                                         and "idle" in _page(b, "status").text)
        assert _page(browser, "source").text == "recorded run"
        assert not _page(browser, "requests-missed").is_displayed()  # a replay starts from the first step
        # The page's short ids are explain's: #i, the i-th request queued.
        shown = browser.execute_script("return [...document.querySelectorAll('#requests .req')]"
                                       ".map(row => [row.dataset.id, row.querySelector('b').textContent])")
        assert dict(shown) == page_labels(trace.requests.values())
        # The phases' colours are the figures' (viz/palette.py), served to the page as CSS variables.
        css = {p: browser.execute_script(f"return getComputedStyle(document.documentElement).getPropertyValue('--{p}')")
               for p in PHASE_COLOURS}
        assert {p: c.strip() for p, c in css.items()} == PHASE_COLOURS
        # Every request finished; no block in use, the shared prompt's blocks still cached.
        summary = _page(browser, "requests-summary")
        assert summary.get_attribute("data-total") == str(len(trace.requests))
        assert summary.get_attribute("data-unfinished") == "0"
        legend = _page(browser, "kv-legend")
        counts = {key: int(legend.get_attribute(f"data-{key}")) for key in ("in-use", "cached-free", "free", "null")}
        assert counts["in-use"] == 0 and counts["cached-free"] > 0 and counts["null"] == 1  # block 0
        assert sum(counts.values()) == 17
        assert _page(browser, "running").get_attribute("data-count") == str(last.batch_size)

        # Paused, the arrows step back through the buffered steps: requests ran and waited.
        _page(browser, "pause").click()
        seen = {}
        for step in range(last.number - 1, 0, -1):  # the steps are numbered 1..last
            _page(browser, "back").click()
            WebDriverWait(browser, 10).until(lambda b: _page(b, "step").text == str(step))  # the next frame
            seen[step] = (int(_page(browser, "running").get_attribute("data-count")),
                          int(_page(browser, "waiting").get_attribute("data-count")),
                          _page(browser, "waiting").text)
        assert set(seen) == {s.number for s in trace.steps[:-1]}
        for step in trace.steps[:-1]:
            running, waiting, _ = seen[step.number]
            assert (running, waiting) == (step.batch_size, step.num_waiting_reqs), step.number
        assert any("preempted" in text or "KV cache" in text for _, _, text in seen.values())

        # A request's events, its trace id and the link into Jaeger.
        request = next(iter(trace.requests.values()))
        browser.execute_script(f"document.querySelector('#requests .req[data-id=\"{request.request_id}\"]').click()")
        WebDriverWait(browser, 10).until(lambda b: "RequestFinished" in _page(b, "details").text)
        details = _page(browser, "details").text
        assert "RequestQueued" in details and "RequestScheduled" in details and request.trace_id in details
        link = browser.execute_script("return document.querySelector('#details a').href")
        assert link == f"{JAEGER}/trace/{request.trace_id}"
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
