"""Engine-wide series computed from the requests and spans, for the gauges and for notebooks.

Both work at either trace level: they read the requests' ``SCHEDULED`` events and the
``detokenize`` spans, not the engine steps.
"""

from __future__ import annotations

import numpy as np

from viz.model import Trace


def prefix_cache_hit_rate(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """``(times, rates)``: after each admission, the tokens found in the prefix cache over the tokens
    looked up, summed over every admission so far (first ones and those after a preemption).

    The engine's own counter (``SchedulerStats.prefix_cache_*``) also counts the lookups of a request
    that then did not fit and stayed waiting; the trace has only the admissions.
    """
    admissions = sorted((a for r in trace.requests.values() for a in r.admissions), key=lambda a: a.time)
    if not admissions:
        return np.zeros(0), np.zeros(0)
    hits = np.cumsum([a.num_computed_tokens for a in admissions])
    lookups = np.cumsum([a.num_tokens for a in admissions])
    return np.array([a.time for a in admissions]), hits / np.maximum(lookups, 1)


def output_throughput(trace: Trace, num_bins: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(bin centres, output tokens per second)``: the tokens each ``detokenize`` span handed to the
    front end, counted in equal bins over the trace (by default one per ~4 spans, 5 to 40 bins)."""
    times = [(s.end_ns - trace.t0_ns) / 1e9 for s in trace.spans if s.name == "detokenize"]
    tokens = [s.attributes.get("detokenize.num_tokens", 0) for s in trace.spans if s.name == "detokenize"]
    if not times:
        return np.zeros(0), np.zeros(0)
    num_bins = num_bins or min(max(len(times) // 4, 5), 40)
    edges = np.linspace(0.0, max(times) + 1e-9, num_bins + 1)
    counts, _ = np.histogram(times, bins=edges, weights=tokens)
    return (edges[:-1] + edges[1:]) / 2, counts / np.diff(edges)
