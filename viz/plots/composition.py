"""Step composition: per engine step, the scheduled tokens stacked as prefill and decode, the token
budget (``max_num_batched_tokens``) as a line, and the batch size on a second axis.

The budget is often far above what a step uses (8192 by default): the token axis then stops a
little above the busiest step and the budget line is labelled at the top edge instead of flattening
every bar.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from viz.model import Trace
from viz.plots.style import PHASE_COLOURS, PREEMPTION, new_figure

BUDGET_COLOUR = "#9467bd"


def plot_step_composition(trace: Trace) -> Figure:
    steps = trace.require_steps()
    x = [s.number for s in steps]
    prefill = [s.num_prefill_tokens for s in steps]
    decode = [s.num_decode_tokens for s in steps]
    budget = [s.token_budget for s in steps]
    figure = new_figure(11, 4.5)
    ax = figure.add_subplot()
    ax.bar(x, prefill, width=1.0, color=PHASE_COLOURS["prefill"], label="prefill tokens")
    ax.bar(x, decode, width=1.0, bottom=prefill, color=PHASE_COLOURS["decode"], label="decode tokens")
    ax.step(x, budget, where="mid", color=BUDGET_COLOUR, lw=2, label="token budget")
    busiest = max(p + d for p, d in zip(prefill, decode))
    top = max(busiest * 1.25, 1)
    if max(budget) > top:
        ax.text(0.99, 0.97, f"token budget {max(budget)} (above the scale)", transform=ax.transAxes,
                ha="right", va="top", color=BUDGET_COLOUR)
    else:
        top = max(budget) * 1.1
    ax.set_ylim(0, top)
    preempted = [s.number for s in steps if s.preempted_req_ids]
    ax.plot(preempted, [1.0] * len(preempted), "v", color=PREEMPTION, ms=7, clip_on=False,
            transform=ax.get_xaxis_transform())
    ax.set_xlabel("engine step")
    ax.set_ylabel("scheduled tokens")
    ax.set_xlim(x[0] - 0.5, x[-1] + 0.5)
    batch = ax.twinx()
    batch.step(x, [s.batch_size for s in steps], where="mid", color="black", lw=1.2)
    batch.set_ylabel("batch size (requests)")
    batch.set_ylim(0, max(s.batch_size for s in steps) * 1.25 + 0.5)
    ax.set_title(f"Step composition: {len(steps)} steps", pad=12)
    handles = [Patch(color=PHASE_COLOURS["prefill"], label="prefill tokens"),
               Patch(color=PHASE_COLOURS["decode"], label="decode tokens"),
               Line2D([], [], color=BUDGET_COLOUR, lw=2, label="token budget"),
               Line2D([], [], color="black", label="batch size (right axis)"),
               Line2D([], [], marker="v", ls="", color=PREEMPTION, label="step with a preemption")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.08, 1), frameon=False)
    return figure
