"""``ObserverProcess``: a vLLM run's tracer in a child process, fed through a pipe (no vLLM needed here:
the recorder's tests in tests/vllm run it inside a real vLLM)."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from tracevllm.core.events import EngineIdle, RequestQueued, StartupPhase
from tracevllm.tracing.observer_process import ObserverProcess
from tracevllm.tracing.schema import VllmAttr
from tracevllm.tracing.vllm_tracer import LlmRequestArrived, LlmRequestFinished, new_trace_headers
from viz.otlp import read_spans


def _one_request(observers: ObserverProcess, request_id: str) -> dict[str, str]:
    """A request told as the ``TracingScheduler`` tells it, arriving and finishing; its trace headers."""
    now = time.time()
    headers = new_trace_headers()
    observers.on_event(LlmRequestArrived(request_id, now - 0.01, now, 5, 3, headers))
    observers.on_event(RequestQueued(request_id, now, 5, 0, headers))
    observers.on_event(LlmRequestFinished(request_id, now + 0.01, "length", 5, 3, 0))
    return headers


def test_the_trace_is_written_when_the_engine_goes_idle_with_the_ids_the_engine_core_chose(tmp_path):
    observers = ObserverProcess.start(str(tmp_path), "tiny")
    now = time.time()
    observers.on_event(StartupPhase("EngineCore init", now, now, {"engine": "vLLM 0.32.0", "flag": True, "n": 3}))
    headers = _one_request(observers, "r1")
    observers.on_event(EngineIdle(time.time()))  # returns once the child has written every span so far
    spans = {span.name: span for span in read_spans(str(tmp_path))}
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    assert (spans["llm_request"].trace_id, spans["llm_request"].span_id) == (trace_id, span_id)
    assert spans["llm_request"].attributes[VllmAttr.REQUEST_ID] == "r1"
    assert spans["EngineCore init"].attributes["flag"] is True  # a bool crosses the pipe as a bool
    child = observers.proc
    observers.on_event(EngineIdle(time.time(), shutdown=True))
    observers.close()
    assert child.returncode == 0 and observers.proc is None


def test_the_child_outlives_sigterm_and_writes_everything_it_is_sent(tmp_path):
    """Ctrl-C or SIGTERM reaches the whole process group; the child ends only when its input does,
    so what the engine core's shutdown records is still written."""
    observers = ObserverProcess.start(str(tmp_path), "tiny")
    observers.proc.send_signal(signal.SIGTERM)
    observers.proc.send_signal(signal.SIGINT)
    _one_request(observers, "after-the-signals")
    observers.close()
    assert [s.attributes[VllmAttr.REQUEST_ID] for s in read_spans(str(tmp_path), ["llm_request"])] == ["after-the-signals"]


@pytest.mark.broken_traces  # what a killed child leaves: an empty trace file
def test_a_child_killed_mid_run_stops_the_recording_not_the_engine(tmp_path, caplog):
    observers = ObserverProcess.start(str(tmp_path), "tiny")
    observers.proc.kill()
    observers.proc.wait()
    with caplog.at_level(logging.ERROR):
        for i in range(3):
            _one_request(observers, str(i))
            observers.on_event(EngineIdle(time.time()))
    assert observers.proc is None
    assert "observer process stopped mid-run" in caplog.text
    observers.close()


def test_a_child_that_cannot_open_the_trace_stops_the_start_up(tmp_path):
    not_a_directory = tmp_path / "a_file"
    not_a_directory.write_text("")
    with pytest.raises(ValueError, match="did not start"):
        ObserverProcess.start(str(not_a_directory), "tiny")
    assert os.listdir(tmp_path) == ["a_file"]
