"""Engine gauges over time: KV cache usage, the running and waiting queues (both from the steps),
the cumulative prefix-cache hit rate and the output-token throughput (``viz/metrics.py``).

Only the panels the trace can fill are drawn: without engine steps (``--trace-level request``) the
first two are left out and the title says why; with no panel to draw it raises ValueError.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from viz.metrics import output_throughput, prefix_cache_hit_rate
from viz.model import Trace
from viz.plots.style import FIGURE_WIDTH, PHASE_COLOURS, PREEMPTION, new_figure

PANEL_INCHES = 1.9


def _kv_usage(ax: Axes, trace: Trace, end: float) -> None:
    steps = trace.steps
    ax.fill_between([s.end for s in steps], [100 * s.kv_cache_usage for s in steps], step="post", color="#8c564b",
                    alpha=0.6)
    for t in (s.end for s in steps if s.preempted_req_ids):
        ax.axvline(t, color=PREEMPTION, lw=0.8, ls="--")
    ax.set_ylim(0, 105)
    ax.set_ylabel("KV usage (%)")
    preempted = " (dashed: a step that preempted)" if any(s.preempted_req_ids for s in steps) else ""
    ax.set_title(f"KV cache usage after each step{preempted}", fontsize=10)


def _queues(ax: Axes, trace: Trace, end: float) -> None:
    ends = [s.end for s in trace.steps]
    ax.step(ends, [s.num_running_reqs for s in trace.steps], where="post", color=PHASE_COLOURS["decode"],
            label="running")
    ax.step(ends, [s.num_waiting_reqs for s in trace.steps], where="post", color=PHASE_COLOURS["preempted"],
            label="waiting")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("requests")
    ax.legend(loc="upper right", frameon=False)
    ax.set_title("requests running and waiting after each step", fontsize=10)


def _hit_rate(ax: Axes, trace: Trace, end: float) -> None:
    times, rates = prefix_cache_hit_rate(trace)
    ax.step([*times, end], [*(100 * rates), 100 * rates[-1]], where="post", color="#17becf")  # held to the end
    ax.set_ylim(0, 105)
    ax.set_ylabel("prefix hits (%)")
    ax.set_title("cumulative prefix-cache hit rate (cached / looked-up tokens, per admission)", fontsize=10)


def _throughput(ax: Axes, trace: Trace, end: float) -> None:
    centres, rate = output_throughput(trace)
    ax.bar(centres, rate, width=(centres[1] - centres[0]) if len(centres) > 1 else 0.1, color="0.4")
    ax.set_ylabel("output tok/s")
    ax.set_title("output tokens per second", fontsize=10)


def plot_engine_gauges(trace: Trace) -> Figure:
    panels = []
    if trace.steps:
        panels += [_kv_usage, _queues]
    if len(prefix_cache_hit_rate(trace)[0]):
        panels.append(_hit_rate)
    if len(output_throughput(trace)[0]):
        panels.append(_throughput)
    if not panels:
        raise ValueError(f"{trace.directory}: no engine steps, admissions or output tokens: no gauge to draw")
    figure = new_figure(FIGURE_WIDTH, 0.8 + PANEL_INCHES * len(panels))
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    end = (max(s.end_ns for s in trace.spans) - trace.t0_ns) / 1e9
    for ax, panel in zip(axes, panels):
        panel(ax, trace, end)
    axes[-1].set_xlabel("time since the first span (s)")
    axes[-1].set_xlim(0, end)
    missing = ("" if trace.steps else
               "\nno KV usage or queues: no engine_step spans (recorded with --trace-level request)")
    figure.suptitle(f"Engine gauges{missing}")
    return figure
