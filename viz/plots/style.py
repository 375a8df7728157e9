"""What every picture shares: Agg figures (never pyplot), the phase colours, one colour and one short
label per request."""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import hsv_to_rgb, to_rgba
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


GOLDEN_ANGLE = 0.381966  # of a turn: each next hue lands in the widest gap the previous ones left


def request_colours(request_ids: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """One colour per request, in the given order: tab20 for up to 20 requests, else hues a golden
    angle apart in three shades, so that no two colours repeat and requests close in arrival order
    (the ones that run together) never get close colours."""
    request_ids = list(request_ids)
    if len(request_ids) <= len(REQUEST_COLOURS):
        return dict(zip(request_ids, REQUEST_COLOURS))
    shades = [(0.75, 0.85), (0.55, 0.95), (0.95, 0.6)]  # (saturation, value)
    return {req_id: (*hsv_to_rgb(((i * GOLDEN_ANGLE) % 1.0, *shades[i % 3])), 1.0)
            for i, req_id in enumerate(request_ids)}


def text_colour(background) -> str:
    """Black on a light colour, white on a dark one (by relative luminance)."""
    r, g, b, _ = to_rgba(background)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.55 else "white"


def request_labels(request_ids: Iterable[str]) -> dict[str, str]:
    """``#i``, the request's index in the given (arrival) order: what the pictures write for a request,
    whose id can be 40 characters long. The report's table pairs each index with the full id."""
    return {req_id: f"#{i}" for i, req_id in enumerate(request_ids)}


def unavailable(ax: Axes, message: str) -> None:
    """An empty panel that says why it is empty."""
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes, color="0.3")
    # Hide this panel's ticks without touching them: the x axis may be shared with panels that have data.
    ax.tick_params(bottom=False, labelbottom=False, left=False, labelleft=False)
