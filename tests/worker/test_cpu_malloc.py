"""Optimisation "keep_freed_memory" (worker/cpu_malloc.py): glibc keeps freed memory for reuse, so
memory freed and allocated again is not page-faulted in again; a CPU worker sets it up when the
switch is on."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from tracevllm import LLM
import tracevllm.worker.gpu_worker as gpu_worker

# 8 tensors of 16 MiB, all alive at once and then all freed, five times over after a warm-up. With
# glibc's defaults the freed top of the heap goes back to the system and part of it faults in again
# each time (about 800 of the 32,768 pages here); kept, none do.
_CHURN = """
import resource, sys, torch
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    from tracevllm.worker.cpu_malloc import keep_freed_memory
    assert keep_freed_memory()
def step():
    live = [torch.ones(4 << 20) for _ in range(8)]
    del live
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""


def _faults_per_step(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_memory_is_reused_without_page_faults():
    assert _faults_per_step("keep") < 32  # of the 32,768 pages each step allocates


def test_a_cpu_worker_keeps_freed_memory_only_with_the_switch_on(tiny_checkpoint, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_worker, "keep_freed_memory", lambda: calls.append(True) or True)
    for disabled, expected in (([], 1), (["keep_freed_memory"], 0)):
        calls.clear()
        llm = LLM(model=tiny_checkpoint("llama"), disable_optimizations=disabled)
        llm.llm_engine.shutdown()
        assert len(calls) == expected, disabled
