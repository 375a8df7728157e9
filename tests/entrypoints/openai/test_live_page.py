"""The live page (``GET /ui``) of a running ``tracevllm serve``, in a real headless Chromium
(tests/conftest.py's ``browser``): during a load of 16 concurrent requests, four at a time, it shows
requests running and waiting; after it, every request finished, no KV block in use but the prefix
cache's, and its step counter is the engine's last step (read from the server's own trace). Opened
again after the load, it says which steps it missed and points to ``traces view``; opened in the middle
of a second load, it places every block in use from the engine's snapshot, and a request it found
says its earlier events are missing."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.server_utils import RemoteServer
from viz.trace_loader import load_trace

pytestmark = pytest.mark.slow

NUM_REQUESTS = 16
SHARED = "You are a helpful assistant. Answer in one long paragraph. "


def _attribute(browser, element_id: str, name: str) -> str:
    return browser.execute_script(f"return document.getElementById({element_id!r}).getAttribute({name!r})")


def _text(browser, element_id: str) -> str:
    return browser.execute_script(f"return document.getElementById({element_id!r}).textContent")


def test_the_page_follows_the_engine(tiny_checkpoint, browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    trace_dir = tmp_path / "traces"
    with RemoteServer([tiny_checkpoint("llama"), "--served-model-name", "tiny", "--dtype", "float32",
                       "--max-num-seqs", "4", "--block-size", "4", "--num-gpu-blocks-override", "256",
                       "--max-model-len", "128", "--trace-out", str(trace_dir)]) as server:
        browser.get_log("browser")  # forget what earlier tests left in the console
        browser.get(f"http://127.0.0.1:{server.port}/ui")
        WebDriverWait(browser, 30).until(lambda b: _text(b, "status").startswith("connected"))
        assert _text(browser, "source") == "live"
        assert _attribute(browser, "requests-missed", "hidden") is not None  # it missed nothing

        def complete(i: int) -> int:
            body = {"model": "tiny", "prompt": f"{SHARED}Question {i}?", "max_tokens": 32, "ignore_eos": True}
            return server.request("POST", "/v1/completions", body)[0]

        most_running = most_waiting = 0
        with ThreadPoolExecutor(NUM_REQUESTS) as pool:
            answers = [pool.submit(complete, i) for i in range(NUM_REQUESTS)]
            while not all(a.done() for a in answers):
                most_running = max(most_running, int(_attribute(browser, "running", "data-count") or 0))
                most_waiting = max(most_waiting, int(_attribute(browser, "waiting", "data-count") or 0))
                time.sleep(0.02)
        assert [a.result() for a in answers] == [200] * NUM_REQUESTS
        assert most_running == 4 and most_waiting > 0, (most_running, most_waiting)

        # The engine is idle once the last request finished: its trace files are complete then.
        WebDriverWait(browser, 30).until(lambda b: _text(b, "status").endswith("idle"))
        engine_last_step = load_trace(str(trace_dir)).steps[-1].number
        assert _text(browser, "step") == str(engine_last_step)
        assert _attribute(browser, "requests-summary", "data-total") == str(NUM_REQUESTS)
        assert _attribute(browser, "requests-summary", "data-unfinished") == "0"
        assert _attribute(browser, "kv-legend", "data-in-use") == "0"
        assert int(_attribute(browser, "kv-legend", "data-cached-free")) > 0  # the prompts' full blocks
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors

        # Opened again after the load, the page says what it missed, and where to see it.
        browser.get(f"http://127.0.0.1:{server.port}/ui")
        WebDriverWait(browser, 30).until(lambda b: _text(b, "status").startswith("connected"))
        assert _attribute(browser, "requests-missed", "hidden") is None
        missed = _text(browser, "requests-missed")
        assert missed.startswith(f"This page connected after step {engine_last_step}: the {engine_last_step} steps "
                                 "before it, and the requests that finished in them, are missing"), missed
        assert "tracevllm traces view DIR" in missed

        # Opened again in the middle of a second load, the page starts from the engine's snapshot: it
        # places every block in use from its first frame, and sees the requests it joined finish.
        with ThreadPoolExecutor(NUM_REQUESTS) as pool:
            answers = [pool.submit(complete, i) for i in range(NUM_REQUESTS)]
            while server.metrics().get("vllm:num_requests_waiting", 0) == 0:
                assert not all(a.done() for a in answers), "the second load never queued"
                time.sleep(0.02)
            browser.get(f"http://127.0.0.1:{server.port}/ui")
            # The first frame that shows a request running: its blocks are in use, every one placed. Read
            # in one script, the frame as drawn: on a fast machine the whole load can end a frame later.
            first_frame = WebDriverWait(browser, 30).until(lambda b: b.execute_script(
                "const d = document.getElementById('kv-legend').dataset;"
                "return document.querySelector('#running .chip') && [Number(d.inUse), Number(d.unplaced)];"))
            most_in_use, most_unplaced = first_frame
            assert _text(browser, "requests-missed").startswith("This page connected after step ")
            # A request running when the page connected: its panel says its first events are missing.
            browser.execute_script("document.querySelector('#running .chip').click()")
            WebDriverWait(browser, 10).until(lambda b: "its events before then are missing" in _text(b, "details"))
            while not all(a.done() for a in answers):
                most_unplaced = max(most_unplaced, int(_attribute(browser, "kv-legend", "data-unplaced") or 0))
                most_in_use = max(most_in_use, int(_attribute(browser, "kv-legend", "data-in-use") or 0))
                time.sleep(0.02)
        assert most_in_use > 0 and most_unplaced == 0, (most_in_use, most_unplaced)
        WebDriverWait(browser, 30).until(lambda b: _text(b, "status").endswith("idle"))
        assert _attribute(browser, "requests-summary", "data-unfinished") == "0"
        assert _attribute(browser, "kv-legend", "data-in-use") == "0"
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
