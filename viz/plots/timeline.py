"""The request timeline: one row per request (in arrival order, the first on top), its life as
queued / prefill / decode / preempted segments (``viz/segments.py``), its first token marked, and
an aborted request's end marked with a cross. A row is labelled ``#i`` (the request's index in arrival
order; the report's table gives the full id), with notes on its cache hits, preemptions, abort."""

from __future__ import annotations

from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from viz.model import Trace
from viz.palette import ABORT_CROSS
from viz.plots.style import FIGURE_WIDTH, PHASE_COLOURS, new_figure, request_labels

ROW_HEIGHT = 0.6
ABORTED = "abort"  # the finish reason of a request the client cancelled
MAX_LABELLED_ROWS = 200  # beyond this, rows get plain numbered ticks


def _label(request, short: str) -> str:
    notes = [f"{request.cached_tokens} cached"] if request.cached_tokens else []
    notes += [f"preempted ×{request.num_preemptions}"] if request.num_preemptions else []
    notes += ["aborted"] if request.finish_reason == ABORTED else []
    return short + (f"  ({', '.join(notes)})" if notes else "")


def plot_request_timeline(trace: Trace) -> Figure:
    requests = list(trace.requests.values())
    row_inches = 0.32 if len(requests) <= 40 else 0.2  # 10 pt labels need 0.14 in
    figure = new_figure(FIGURE_WIDTH, min(2.4 + row_inches * len(requests), 2.4 + 0.2 * MAX_LABELLED_ROWS))
    ax = figure.add_subplot()
    # One collection per phase and one per mark, not an artist per request: 1,000 requests draw in
    # well under a second.
    boxes: dict[str, list] = {kind: [] for kind in PHASE_COLOURS}
    for row, request in enumerate(requests):
        low, high = row - ROW_HEIGHT / 2, row + ROW_HEIGHT / 2
        for s in request.segments:
            boxes[s.kind].append([(s.start, low), (s.end, low), (s.end, high), (s.start, high)])
    for kind, polygons in boxes.items():
        ax.add_collection(PolyCollection(polygons, facecolors=PHASE_COLOURS[kind], edgecolors="none"))
    ax.add_collection(LineCollection([[(r.arrival, row), (r.queued, row)] for row, r in enumerate(requests)],
                                     colors="0.5", linewidths=1))
    first = [(r.first_token, row) for row, r in enumerate(requests) if r.first_token is not None]
    if first:
        ax.plot(*zip(*first), marker="D", ms=5, ls="", color="black", zorder=3)
    aborted = [(r.finished, row) for row, r in enumerate(requests) if r.finish_reason == ABORTED]
    if aborted:
        ax.plot(*zip(*aborted), marker="X", ms=8, ls="", color=ABORT_CROSS, zorder=3)
    ax.autoscale_view()
    if len(requests) <= MAX_LABELLED_ROWS:
        labels = request_labels(trace.requests)
        ax.set_yticks(range(len(requests)), [_label(r, labels[r.request_id]) for r in requests])
    ax.set_ylim(len(requests) - 0.5, -0.5)
    ax.set_xlabel("time since the first span (s)")
    ax.set_ylabel("request (# in arrival order)")
    ax.set_title(f"Request timeline: {len(requests)} request{'s' if len(requests) != 1 else ''}")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=k) for k, c in PHASE_COLOURS.items() if boxes[k]]
    if first:
        handles.append(Line2D([], [], marker="D", ls="", color="black", label="first token (TTFT)"))
    if aborted:
        handles.append(Line2D([], [], marker="X", ls="", color=ABORT_CROSS, label="aborted"))
    figure.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), frameon=False)
    return figure
