"""What every picture shares: Agg figures (never pyplot) sized for the book's column, the phase
colours (``viz/palette.py``, the one palette of every picture and page), one colour and one short
label per request.

The book shows a picture in a column 676 px wide (Jupyter Book's article column), so a figure ``w``
inches wide is scaled until it is 676 px, and a font of ``f`` points shows as ``f * 676 / (72 * w)``
px. ``min_font_size(w)`` is the smallest font that still shows as ``MIN_LABEL_PX``; the pictures
are ``FIGURE_WIDTH`` inches wide so that matplotlib's default 10 pt (and nothing below 9 pt) passes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import hsv_to_rgb, to_rgb, to_rgba
from matplotlib.figure import Figure

from viz import palette
from viz.palette import PHASE_COLOURS, WAITING

BOOK_COLUMN_PX = 676
MIN_LABEL_PX = 10
FIGURE_WIDTH = 8.0

FREE_BLOCK = to_rgba(palette.FREE_BLOCK)
PREEMPTION = PHASE_COLOURS["preempted"]
# Colours that mean something other than a request, each with the least distance (CIE76 ΔE: about
# 2.3 is the smallest difference an eye sees) a request's colour keeps from it. A chip's phase edge
# must stand out from its fill (35 keeps tab20's light green off the decode edge, its grey and
# brown off the waiting edge); a light request colour must not pass for a free block (20).
CHIP_EDGES = {"prefill": PHASE_COLOURS["prefill"], "decode": PHASE_COLOURS["decode"],
              "preempted": PHASE_COLOURS["preempted"], "waiting": WAITING}
RESERVED_COLOURS = {**{colour: 35.0 for colour in CHIP_EDGES.values()}, FREE_BLOCK: 20.0}


def min_font_size(width_inches: float) -> float:
    """The smallest font (points) of a figure ``width_inches`` wide that shows as ``MIN_LABEL_PX``
    pixels once the figure is scaled to the book's column."""
    return MIN_LABEL_PX * 72 * width_inches / BOOK_COLUMN_PX


def _lab(colour) -> np.ndarray:
    """CIE L*a*b* (D65) of an sRGB colour."""
    rgb = np.array(to_rgb(colour))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    xyz /= (0.95047, 1.0, 1.08883)
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def colour_distance(a, b) -> float:
    """How far apart two colours look: CIE76 ΔE, the distance in L*a*b*."""
    return float(np.linalg.norm(_lab(a) - _lab(b)))


def _free(colour) -> bool:
    return all(colour_distance(colour, reserved) >= least for reserved, least in RESERVED_COLOURS.items())


# tab20 holds ten dark/light pairs: the dark ones first, so that a few requests all get strong
# colours; those too near a reserved colour (blue, green, red, the greys, brown) are left out.
REQUEST_COLOURS = [to_rgba(c) for c in colormaps["tab20"].colors[0::2] + colormaps["tab20"].colors[1::2]
                   if _free(c)]


def new_figure(width: float, height: float) -> Figure:
    """A figure drawn by Agg, outside pyplot: nothing is shown, nothing is kept alive globally."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


GOLDEN_ANGLE = 0.381966  # of a turn: each next hue lands in the widest gap the previous ones left


def _golden_hues():
    shades = [(0.75, 0.85), (0.55, 0.95), (0.95, 0.6)]  # (saturation, value)
    i = 0
    while True:
        colour = (*hsv_to_rgb(((i * GOLDEN_ANGLE) % 1.0, *shades[i % 3])), 1.0)
        if _free(colour):
            yield colour
        i += 1


def request_colours(request_ids: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """One colour per request, in the given order, none near a reserved colour: tab20's for up to
    ``len(REQUEST_COLOURS)`` requests, else hues a golden angle apart in three shades, so that no two
    colours repeat and requests close in arrival order (the ones that run together) never get close
    colours."""
    request_ids = list(request_ids)
    if len(request_ids) <= len(REQUEST_COLOURS):
        return dict(zip(request_ids, REQUEST_COLOURS))
    return dict(zip(request_ids, _golden_hues()))


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
