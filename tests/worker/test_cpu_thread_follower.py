"""Threads that follow the load (worker/cpu_thread_follower.py): the load other processes put on the
cores is read from the machine, a change sets off a probe, and the probe is drawn in the trace inside
the step that paid for it, which the step-cost fits leave out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.trace_utils import attrs, load_spans
from tracevllm import LLM, SamplingParams
from tracevllm.worker import cpu_thread_follower
from tracevllm.worker.cpu_thread_follower import CpuThreadFollower
from tracevllm.worker.cpu_threads import CpuThreads
from viz.trace_loader import load_trace
from viz.fit import fit_steps

needs_two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2 or not os.path.exists("/proc/stat"),
    reason="needs Linux and two cores",
)


@needs_two_cores
def test_a_busy_neighbour_shows_as_others_load():
    """A real process spinning on one of the cores is about one core of others' load."""
    core = min(os.sched_getaffinity(0))
    follower = CpuThreadFollower(2, 2)
    neighbour = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\n"
                                  "while True: pass"])
    try:
        time.sleep(0.3)
        follower.others_load()  # a window that starts with the neighbour running
        time.sleep(cpu_thread_follower.CHECK_SECONDS + 0.2)
        others = follower.others_load()
    finally:
        neighbour.kill()
        neighbour.wait()
    assert others is not None and others >= 0.7


class _Machine:
    """A fake clock and CPU accounting: ``run(seconds, busy, own)`` advances time by ``seconds`` with
    the cores busy ``busy`` cores' worth, ``own`` of them this process's."""

    def __init__(self) -> None:
        self.now = self.busy = self.own = 0.0

    def run(self, seconds: float, busy: float, own: float) -> None:
        self.now += seconds
        self.busy += busy * seconds
        self.own += own * seconds

    def monotonic(self) -> float:
        return self.now

    time = perf_counter = monotonic


def _fake_machine(monkeypatch) -> tuple[_Machine, list[list[int]]]:
    """A fake machine, and the counts each probe was asked to try (each probe finds the first)."""
    machine, tried = _Machine(), []
    monkeypatch.setattr(cpu_thread_follower, "time", machine)
    monkeypatch.setattr(cpu_thread_follower, "_busy_seconds", lambda cpus: machine.busy)
    monkeypatch.setattr(cpu_thread_follower, "_own_seconds", lambda: machine.own)

    def measure(cores, counts):
        tried.append(counts)
        return CpuThreads(counts[0], cores, "measured")

    monkeypatch.setattr(cpu_thread_follower, "measure_cpu_threads", measure)
    return machine, tried


def test_a_probe_only_tries_counts_in_the_direction_the_load_moved(monkeypatch):
    """Fewer free cores than threads: fewer threads than now are tried (and the count now); more free:
    more. The neighbour leaving while a client keeps a third of a core busy still sends it back up."""
    machine, tried = _fake_machine(monkeypatch)
    follower = CpuThreadFollower(4, 4)
    machine.run(3, busy=4.0, own=3.0)  # a neighbour on one core
    assert follower.check() is not None and tried[-1] == [4, 2, 1]
    follower.num_threads = 2
    machine.run(5, busy=2.2, own=1.9)  # the neighbour left; a client uses a third of a core
    assert follower.check() is not None and tried[-1] == [4, 2]
    follower.num_threads = 1
    machine.run(5, busy=2.5, own=1.0)  # one thread and 1.5 cores used by others: more is free, up again
    assert follower.check() is not None and tried[-1] == [4, 2, 1]


def test_probes_when_the_load_changes_and_backs_off_when_it_keeps_the_count(monkeypatch):
    machine = _Machine()
    measured: list[int] = []  # what each probe is made to find
    monkeypatch.setattr(cpu_thread_follower, "time", machine)
    monkeypatch.setattr(cpu_thread_follower, "_busy_seconds", lambda cpus: machine.busy)
    monkeypatch.setattr(cpu_thread_follower, "_own_seconds", lambda: machine.own)
    monkeypatch.setattr(cpu_thread_follower, "measure_cpu_threads",
                        lambda cores, counts: CpuThreads(measured.pop(0), cores, "measured"))
    follower = CpuThreadFollower(2, 2)

    machine.run(3, busy=1.9, own=1.9)  # quiet: only this engine
    assert follower.check() is None
    machine.run(1, busy=2.0, own=1.5)  # a neighbour takes half a core from our thread
    measured.append(1)
    probe = follower.check()
    assert (probe.before, probe.after, probe.others_load) == (2, 1, 0.5)
    machine.run(1, busy=2.0, own=1.0)  # one thread, the neighbour has its core: nothing to do
    assert follower.check() is None
    machine.run(1, busy=2.0, own=0.7)  # ... and a client's bursts too: fewer free than threads, but no fewer to try
    assert follower.check() is None
    machine.run(1, busy=1.0, own=1.0)  # the neighbour left: a core more is free
    measured.append(2)
    probe = follower.check()
    assert (probe.before, probe.after) == (1, 2) and follower.num_threads == 2
    # Bursty load that does not make fewer threads faster: each probe keeps 2, and waits twice as long.
    waits = []
    for second in range(1, 40):
        machine.run(1, busy=2.0, own=1.5)
        measured.append(2)
        if follower.check() is not None:
            waits.append(second)
        else:
            measured.pop()
    assert waits[:4] == [2, 6, 14, 30]  # 2 s after the last change, then 4, 8, 16 s after each probe


@needs_two_cores
def test_a_probe_is_drawn_in_its_step_and_left_out_of_the_fits(tiny_checkpoint, tmp_path, monkeypatch):
    """A phantom neighbour using both cores sets a real probe off in the first step; it leaves then, and
    the probes wait an hour."""
    real_busy, real_measure = cpu_thread_follower._busy_seconds, cpu_thread_follower.measure_cpu_threads
    start = time.monotonic()
    phantom: list[float] = []  # the phantom's seconds, frozen by the first probe

    def busy_seconds(cpus):
        return real_busy(cpus) + (phantom[0] if phantom else 2 * (time.monotonic() - start))

    def measure(cores, counts):
        phantom.append(phantom[0] if phantom else 2 * (time.monotonic() - start))
        monkeypatch.setattr(cpu_thread_follower, "MIN_PROBE_WAIT", 3600.0)
        return real_measure(cores, counts)

    monkeypatch.setattr(cpu_thread_follower, "_busy_seconds", busy_seconds)
    monkeypatch.setattr(cpu_thread_follower, "measure_cpu_threads", measure)
    monkeypatch.setattr(cpu_thread_follower, "CHECK_SECONDS", 0.0)
    monkeypatch.setattr(cpu_thread_follower, "MIN_PROBE_WAIT", 0.0)
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", trace_out=str(tmp_path))
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (12, 40, 9)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)

    trace = load_trace(str(tmp_path))
    (probed,) = [s for s in trace.steps if s.cpu_threads_probe_seconds]
    assert probed.number == trace.steps[0].number
    spans = load_spans(tmp_path)
    by_id = {s["spanId"]: s for s in spans}
    (probe,) = [s for s in spans if s["name"] == "cpu_threads.probe"]
    found = attrs(probe)
    assert attrs(by_id[probe["parentSpanId"]])["step.number"] == probed.number
    assert found["cpu.threads.before"] in (1, 2) and found["cpu.threads.after"] in (1, 2)
    assert found["cpu.others_load"] >= 1.5 and "fewer free than threads" in found["cpu.threads.reason"]

    others = tuple(s for s in trace.steps if s is not probed)
    assert fit_steps(trace.steps).coefficients == fit_steps(others).coefficients
