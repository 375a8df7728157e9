"""Engine gauges over time: KV cache usage, the running and waiting queues (both from the steps),
the cumulative prefix-cache hit rate and the output-token throughput (``viz/metrics.py``)."""

from __future__ import annotations

from matplotlib.figure import Figure

from viz.metrics import output_throughput, prefix_cache_hit_rate
from viz.model import Trace
from viz.plots.style import PHASE_COLOURS, PREEMPTION, new_figure, unavailable


def plot_engine_gauges(trace: Trace) -> Figure:
    figure = new_figure(11, 8)
    kv, queues, hit_rate, throughput = figure.subplots(4, 1, sharex=True)
    steps = trace.steps
    if steps:
        ends = [s.end for s in steps]
        kv.fill_between(ends, [100 * s.kv_cache_usage for s in steps], step="post", color="#8c564b", alpha=0.6)
        for t in (s.end for s in steps if s.preempted_req_ids):
            kv.axvline(t, color=PREEMPTION, lw=0.8, ls="--")
        kv.set_ylim(0, 105)
        kv.set_ylabel("KV usage (%)")
        queues.step(ends, [s.num_running_reqs for s in steps], where="post", color=PHASE_COLOURS["decode"],
                    label="running")
        queues.step(ends, [s.num_waiting_reqs for s in steps], where="post", color=PHASE_COLOURS["preempted"],
                    label="waiting")
        queues.set_ylabel("requests")
        queues.legend(loc="upper right", frameon=False)
        kv.set_title("KV cache usage after each step (dashed: a step that preempted)", fontsize=10)
    else:
        for ax in (kv, queues):
            unavailable(ax, "no engine_step spans: recorded with --trace-level request")
    end = (max(s.end_ns for s in trace.spans) - trace.t0_ns) / 1e9
    times, rates = prefix_cache_hit_rate(trace)
    if len(times):  # held until the end of the trace
        hit_rate.step([*times, end], [*(100 * rates), 100 * rates[-1]], where="post", color="#17becf")
    hit_rate.set_ylim(0, 105)
    hit_rate.set_ylabel("prefix hits (%)")
    hit_rate.set_title("cumulative prefix-cache hit rate (cached / looked-up tokens, per admission)", fontsize=10)
    centres, rate = output_throughput(trace)
    throughput.bar(centres, rate, width=(centres[1] - centres[0]) if len(centres) > 1 else 0.1, color="0.4")
    throughput.set_ylabel("output tok/s")
    throughput.set_xlabel("time since the first span (s)")
    throughput.set_xlim(0, end)
    figure.suptitle("Engine gauges")
    return figure
