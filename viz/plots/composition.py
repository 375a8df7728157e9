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
from matplotlib.ticker import MaxNLocator

from viz.model import Trace
from viz.plots.style import FIGURE_WIDTH, PHASE_COLOURS, PREEMPTION, new_figure

BUDGET_COLOUR = "#9467bd"


def plot_step_composition(trace: Trace) -> Figure:
    steps = trace.require_steps()
    x = [s.number for s in steps]
    prefill = [s.num_prefill_tokens for s in steps]
    decode = [s.num_decode_tokens for s in steps]
    budget = [s.token_budget for s in steps]
    figure = new_figure(FIGURE_WIDTH, 4.8)
    ax = figure.add_subplot()
    ax.bar(x, prefill, width=1.0, color=PHASE_COLOURS["prefill"], label="prefill tokens")
    ax.bar(x, decode, width=1.0, bottom=prefill, color=PHASE_COLOURS["decode"], label="decode tokens")
    busiest = max(p + d for p, d in zip(prefill, decode))
    top = max(busiest * 1.25, 1)
    budget_shown = max(budget) <= top
    if budget_shown:
        ax.step(x, budget, where="mid", color=BUDGET_COLOUR, lw=2, label="token budget")
        top = max(budget) * 1.1
    else:
        ax.text(0.99, 0.97, f"token budget {max(budget)} (above the scale)", transform=ax.transAxes,
                ha="right", va="top", color=BUDGET_COLOUR)
    ax.set_ylim(0, top)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    preempted = [s.number for s in steps if s.preempted_req_ids]
    if preempted:
        ax.plot(preempted, [1.0] * len(preempted), "v", color=PREEMPTION, ms=7, clip_on=False,
                transform=ax.get_xaxis_transform())
    ax.set_xlabel("engine step")
    ax.set_ylabel("scheduled tokens")
    ax.set_xlim(x[0] - 0.5, x[-1] + 0.5)
    batch = ax.twinx()
    batch.step(x, [s.batch_size for s in steps], where="mid", color="black", lw=1.2)
    batch.set_ylabel("batch size (requests)")
    batch.set_ylim(0, max(s.batch_size for s in steps) * 1.25 + 0.5)
    batch.yaxis.set_major_locator(MaxNLocator(integer=True))  # a batch holds whole requests
    ax.set_title(f"Step composition: {len(steps)} steps", pad=12)
    handles = [Patch(color=PHASE_COLOURS["prefill"], label="prefill tokens")] if any(prefill) else []
    handles += [Patch(color=PHASE_COLOURS["decode"], label="decode tokens")] if any(decode) else []
    handles += [Line2D([], [], color=BUDGET_COLOUR, lw=2, label="token budget")] if budget_shown else []
    handles.append(Line2D([], [], color="black", label="batch size (right axis)"))
    if preempted:
        handles.append(Line2D([], [], marker="v", ls="", color=PREEMPTION, label="step with a preemption"))
    figure.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), frameon=False)
    return figure
