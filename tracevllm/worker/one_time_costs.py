"""The one-time costs of this process: what it built, compiled, or loaded from the machine's cache, once.

Whatever builds something once ``record``s it here: ``attention/ops/cpu_extension.py`` each C++ op,
and ``watch_torch_compile`` each torch.compile. The worker hands the list on: what start-up paid to
the engine core when its start-up phase ends (``Worker.take_one_time_costs``), what a step paid in
that step's ``ModelRunnerOutput``. The core records each as a ``OneTimeCost`` event, and the trace
shows it inside the phase or the step that paid it, with how long it took and whether it came from
the cache; ``traces explain`` names it, and the step-cost fits leave such a step out.
"""

from __future__ import annotations

import functools
import time

from tracevllm.core.events import OneTimeCost

_costs: list[OneTimeCost] = []


def record(what: str, start_time: float, seconds: float, cached: bool) -> None:
    """``start_time`` from the wall clock, ``seconds`` from a monotonic one (``time.perf_counter``), as
    a step's stages are timed: a cost then never outlasts the step that paid it, even where the wall
    clock is stepped while it runs (a VM's clock after a pause)."""
    _costs.append(OneTimeCost(what, start_time, start_time + seconds, cached))


def take() -> list[OneTimeCost]:
    """The costs recorded since the last ``take``."""
    costs = _costs[:]
    _costs.clear()
    return costs


@functools.cache  # once per process: later calls find the callbacks in place
def watch_torch_compile() -> None:
    """From now on, record each torch.compile in this process (optimisation "compiled_norm_act" on
    CUDA compiles in the start-up's warm-up; a new shape or dtype can make it compile again inside a
    step, and then that step's trace says so). Through torch's compile callbacks, which cost nothing
    while nothing compiles."""
    from torch._dynamo.callback import on_compile_end, on_compile_start

    started: list[tuple[float, float]] = []  # (wall clock, perf_counter)

    @on_compile_start
    def _start(*_) -> None:
        started.append((time.time(), time.perf_counter()))

    @on_compile_end
    def _end(*_) -> None:
        if started:
            start_time, start = started.pop()
            record("torch.compile", start_time, time.perf_counter() - start, cached=False)
