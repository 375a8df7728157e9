"""Two runs' request timelines aligned (``tracevllm traces diff A B -o PICTURE``): one row per request,
in A's arrival order, A's life in the upper half of the row and B's in the lower half, on one time
axis (seconds since each run's first span), in the phase colours of the request timeline
(``timeline.py``). B's half is paler, and its first token an open diamond. A vertical line marks
where the schedules part, at the start of that step in each run."""

from __future__ import annotations

import os

from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from viz.diff import Comparison
from viz.model import Request
from viz.plots.style import FIGURE_WIDTH, PHASE_COLOURS, new_figure, request_labels
from viz.plots.timeline import MAX_LABELLED_ROWS

HALF = 0.38  # of a row: A's bar above the row's centre line, B's below, a gap between them
B_ALPHA = 0.5
DIVERGENCE = "#9467bd"
MAX_NAME = 30  # characters of a run's directory name in the title


def _halves(requests: list[Request], upper: bool) -> dict[str, list]:
    boxes: dict[str, list] = {kind: [] for kind in PHASE_COLOURS}
    for row, request in enumerate(requests):
        low, high = (row - HALF, row - 0.02) if upper else (row + 0.02, row + HALF)
        for s in request.segments:
            boxes[s.kind].append([(s.start, low), (s.end, low), (s.end, high), (s.start, high)])
    return boxes


def _delta_label(delta: float | None) -> str:
    return "" if delta is None else f"  e2e {delta:+.2f} s"


def plot_aligned_timelines(c: Comparison) -> Figure:
    requests_a = list(c.a.requests.values())
    requests_b = [c.b.requests[r.request_id] for r in requests_a]
    row_inches = 0.4 if len(requests_a) <= 40 else 0.2
    figure = new_figure(FIGURE_WIDTH, min(2.8 + row_inches * len(requests_a), 2.8 + 0.2 * MAX_LABELLED_ROWS))
    ax = figure.add_subplot()
    drawn = set()
    for requests, upper, alpha in ((requests_a, True, 1.0), (requests_b, False, B_ALPHA)):
        for kind, polygons in _halves(requests, upper).items():
            ax.add_collection(PolyCollection(polygons, facecolors=PHASE_COLOURS[kind], edgecolors="none", alpha=alpha))
            drawn |= {kind} if polygons else set()
    handles = [Patch(color=colour, label=kind) for kind, colour in PHASE_COLOURS.items() if kind in drawn]
    for requests, offset, face, name in ((requests_a, -HALF / 2, "black", "A"), (requests_b, HALF / 2, "white", "B")):
        first = [(r.first_token, row + offset) for row, r in enumerate(requests) if r.first_token is not None]
        if first:
            ax.plot(*zip(*first), marker="D", ms=5, ls="", markerfacecolor=face, markeredgecolor="black", zorder=3)
            handles.append(Line2D([], [], marker="D", ls="", markerfacecolor=face, markeredgecolor="black",
                                  label=f"first token, {name}"))
    d = c.divergence
    if d is not None:
        for start, style, name in ((d.start_a, "-", "A"), (d.start_b, "--", "B")):
            if start is not None:
                ax.axvline(start, color=DIVERGENCE, ls=style, lw=1.2, zorder=4)
                handles.append(Line2D([], [], color=DIVERGENCE, ls=style, label=f"step {d.step} in {name}"))
    ax.autoscale_view()
    if len(requests_a) <= MAX_LABELLED_ROWS:
        labels = request_labels(c.a.requests)
        deltas = {r.request_id: r.e2e_delta for r in c.requests}
        ax.set_yticks(range(len(requests_a)), [labels[r.request_id] + _delta_label(deltas[r.request_id])
                                               for r in requests_a])
    ax.set_ylim(len(requests_a) - 0.5, -0.5)
    ax.set_xlabel("time since each run's first span (s)")
    ax.set_ylabel("request (# in A's arrival order; e2e: B - A)")
    parted = "schedules never part" if d is None else f"schedules part at step {d.step}"
    if not c.schedules_compared:
        parted = "schedules not compared"
    name_a, name_b = (os.path.basename(os.path.normpath(t.directory))[:MAX_NAME] for t in (c.a, c.b))
    ax.set_title(f"A: {name_a} (upper halves)   B: {name_b} (lower halves, paler)\n{parted}")
    ax.grid(axis="x", alpha=0.3)
    figure.legend(handles=handles, loc="outside lower center", ncol=4, frameon=False)
    return figure
