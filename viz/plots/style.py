"""What every picture shares: Agg figures (never pyplot), the phase colours, one colour per request."""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

PHASE_COLOURS = {"queued": "#c7c7c7", "prefill": "#1f77b4", "decode": "#2ca02c", "preempted": "#d62728"}
FREE_BLOCK = to_rgba("#f2f2f2")
PREEMPTION = "#d62728"
# tab20 holds ten dark/light pairs: the dark ones first, so that a few requests all get strong colours.
REQUEST_COLOURS = [to_rgba(c) for c in colormaps["tab20"].colors[0::2] + colormaps["tab20"].colors[1::2]]


def new_figure(width: float, height: float) -> Figure:
    """A figure drawn by Agg, outside pyplot: nothing is shown, nothing is kept alive globally."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def request_colours(request_ids: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """One colour per request, in the given order (they repeat after 20)."""
    return {req_id: REQUEST_COLOURS[i % len(REQUEST_COLOURS)] for i, req_id in enumerate(request_ids)}


def unavailable(ax: Axes, message: str) -> None:
    """An empty panel that says why it is empty."""
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes, color="0.3")
    # Hide this panel's ticks without touching them: the x axis may be shared with panels that have data.
    ax.tick_params(bottom=False, labelbottom=False, left=False, labelleft=False)
