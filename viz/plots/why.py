"""The why panel as a picture: for each run, each request's e2e as one bar cut into the parts
``viz/explain.py`` charges it to (``report.html``'s why panel, in the same colours), in arrival order::

    (a) a long prompt ahead of four short ones
    #0  |=========== prefill ===========|
    #1  |////// queued.token_budget //////|= prefill =|
    ...
        seconds since the request arrived
    key: the parts drawn, nothing else
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from viz.explain import PARTS, explain
from viz.model import Trace
from viz.palette import PART_COLOURS
from viz.plots.style import FIGURE_WIDTH, new_figure, request_labels

ROW_INCHES = 0.32


def plot_why(runs: dict[str, Trace]) -> Figure:
    """A panel per run (titled by its key), a bar per request, and one key of the parts drawn below."""
    explained = {title: explain(trace) for title, trace in runs.items()}
    heights = [len(x) + 1.5 for x in explained.values()]
    figure = new_figure(FIGURE_WIDTH, 1.6 + ROW_INCHES * sum(heights))
    axes = figure.subplots(len(runs), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    drawn: set[str] = set()
    for ax, (title, explanations), trace in zip(axes, explained.items(), runs.values()):
        rank = {request_id: i for i, request_id in enumerate(trace.requests)}
        explanations = sorted(explanations, key=lambda x: rank[x.request_id])
        labels = request_labels(trace.requests)
        for row, x in enumerate(explanations):
            left = 0.0
            for part in (p for p in PARTS if x.parts.get(p, 0.0) > 0):
                ax.barh(row, x.parts[part], left=left, height=0.7, color=PART_COLOURS[part])
                left += x.parts[part]
                drawn.add(part)
        ax.set_yticks(range(len(explanations)), [labels[x.request_id] for x in explanations])
        ax.set_ylim(len(explanations) - 0.5, -0.5)
        ax.set_title(title, fontsize=10, loc="left")
    axes[-1].set_xlabel("seconds since the request arrived")
    handles = [Patch(color=PART_COLOURS[p], label=p) for p in PARTS if p in drawn]
    figure.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False, fontsize=9)
    return figure
