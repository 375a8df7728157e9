"""The one-time costs of this process: what it built, or loaded from the machine's cache, once.

Whatever builds something once (``attention/ops/cpu_extension.py``: each C++ op) ``record``s it
here; the worker hands the list to the engine core (``Worker.take_one_time_costs``) when its start-up
phase ends, and the core records each as a ``OneTimeCost`` event: the trace shows it inside that
phase (``Load model``), with how long it took and whether it came from the cache.
"""

from __future__ import annotations

from tracevllm.core.events import OneTimeCost

_costs: list[OneTimeCost] = []


def record(what: str, start_time: float, end_time: float, cached: bool) -> None:
    _costs.append(OneTimeCost(what, start_time, end_time, cached))


def take() -> list[OneTimeCost]:
    """The costs recorded since the last ``take``."""
    costs = _costs[:]
    _costs.clear()
    return costs
