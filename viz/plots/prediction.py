"""A what-if prediction against the run it predicted (``tracevllm traces whatif``, chapter 13): a
column per pair of runs, each step's tokens above (the real run's as bars, prefill under decode,
the prediction's as dots, a real preemption as a red line) and each request's e2e below, real
against predicted (on the diagonal, a perfect prediction)::

    (a) budget 32                 (b) 24 KV blocks
    tokens |▇▅▇·▇▇▅·|             |▇▇|▇▅·▇|      <- bars real, dots predicted, | a preemption
    e2e    |   ·⋰   |             |  ·⋰  |       <- predicted over real
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from viz.model import Trace
from viz.plots.style import FIGURE_WIDTH, PHASE_COLOURS, PREEMPTION, new_figure

PREDICTED = "black"


def plot_predictions(pairs: dict[str, tuple[Trace, Trace]]) -> Figure:
    """``pairs``: a title -> (the real run, its prediction), one column each; the requests are
    matched by id."""
    figure = new_figure(FIGURE_WIDTH, 6.2)
    axes = figure.subplots(2, len(pairs), squeeze=False)
    preempted = False
    for col, (title, (real, predicted)) in enumerate(pairs.items()):
        top, bottom = axes[0][col], axes[1][col]
        steps = real.require_steps()
        numbers = [s.number for s in steps]
        prefill = [s.num_prefill_tokens for s in steps]
        top.bar(numbers, prefill, width=1.0, color=PHASE_COLOURS["prefill"])
        top.bar(numbers, [s.num_decode_tokens for s in steps], width=1.0, bottom=prefill, color=PHASE_COLOURS["decode"])
        top.plot([s.number for s in predicted.require_steps()], [s.num_scheduled_tokens for s in predicted.steps],
                 ".", color=PREDICTED)
        for s in steps:
            if s.preempted_req_ids:
                top.axvline(s.number, color=PREEMPTION, lw=0.8)
                preempted = True
        top.set_title(title, fontsize=10, loc="left")
        top.set_xlabel("engine step")
        real_e2e = [x.e2e for x in real.requests.values()]
        predicted_e2e = [predicted.requests[r].e2e for r in real.requests]
        bottom.plot(real_e2e, predicted_e2e, "o", color=PREDICTED, ms=3)
        edge = max(real_e2e + predicted_e2e) * 1.05
        bottom.plot([0, edge], [0, edge], color="0.6", lw=0.8)
        bottom.set_xlim(0, edge)
        bottom.set_ylim(0, edge)
        bottom.set_aspect("equal")
        bottom.set_xlabel("e2e, real run (s)")
    axes[0][0].set_ylabel("tokens")
    axes[1][0].set_ylabel("e2e, predicted (s)")
    handles = [Patch(color=PHASE_COLOURS["prefill"], label="prefill tokens (real)"),
               Patch(color=PHASE_COLOURS["decode"], label="decode tokens (real)"),
               Line2D([], [], marker=".", ls="", color=PREDICTED, label="tokens (predicted)")]
    if preempted:
        handles.append(Line2D([], [], color=PREEMPTION, lw=0.8, label="a preemption (real)"))
    handles.append(Line2D([], [], marker="o", ms=3, ls="", color=PREDICTED, label="a request's e2e"))
    figure.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False, fontsize=9)
    return figure
