"""Engine-wide series computed from the requests and spans, for the gauges and for notebooks.

Both work at either trace level: they read the requests (their admissions and token times), not
the engine steps.
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
    """``(bin centres, output tokens per second)``, counted in equal bins over the trace (by default
    about one per 4 requests, 5 to 40 bins). A request's first token counts at its TTFT and the rest
    evenly over its decode time, which is what its spans record of when tokens came."""
    times = []
    for r in trace.requests.values():
        if r.first_token is None or not r.num_output_tokens:
            continue
        last_token = r.first_token + (r.decode_time or 0.0)
        times.append(np.linspace(r.first_token, last_token, r.num_output_tokens))
    if not times:
        return np.zeros(0), np.zeros(0)
    times = np.concatenate(times)
    num_bins = num_bins or min(max(len(trace.requests) // 4, 5), 40)
    edges = np.linspace(0.0, times.max() + 1e-9, num_bins + 1)
    counts, _ = np.histogram(times, bins=edges)
    return (edges[:-1] + edges[1:]) / 2, counts / np.diff(edges)
