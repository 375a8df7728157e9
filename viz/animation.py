"""Replaying a trace step by step, for notebooks: ``render_step(trace, k)`` draws engine step ``k``,
``write_animation(trace, path)`` all of them (an animated GIF, or a self-contained HTML page).

A frame (requests named by their index in arrival order, ``#7``; blocks by id)::

    step 25: 130 tokens, 2 running, 1 waiting after it          | KV blocks: 9 of 15 in use after the step
    scheduled  [#1] [#2]         a chip per request: its colour,   |  1  2  3  4
               P 9  D 1          edge and note = prefill/decode    |  5  6  7  8   colour = request,
    preempted  -                 and tokens this step              |  ...          hatched = shared
    waiting    [#3]                                                |

A chip's fill is its request's colour and its ring the phase's (``CHIP_EDGES``), apart by a white
gap, and no request's colour comes near a phase's (``style.RESERVED_COLOURS``): the ring always shows.

The scheduled and preempted requests and the counts come from the step's attributes; the waiting
requests' names from the requests' segments (waiting when a queued or preempted segment covers the
step's end), since a step records only how many wait. The KV panel shows the blocks the whole trace
ever used (a server's cache is mostly never touched), in id order, row by row; its count leaves out the
null block (block 0, never used: ``Trace.num_null_blocks``).

Every frame has the same fixed layout (no layout engine runs per frame), so the chips sit on one
grid: at most ``CHIPS_PER_ROW`` per row, a few rows per queue, then "+N more". The frame is sized
for the book's 676-px column: every text shows at 10 px or more there (``style.min_font_size``).
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

import numpy as np
from matplotlib.animation import FuncAnimation, HTMLWriter
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from tqdm.auto import tqdm

from viz.model import Step, Trace
from viz.plots.style import CHIP_EDGES, FREE_BLOCK, min_font_size, request_colours, request_labels, text_colour

CHIPS_PER_ROW = 10
QUEUE_ROWS = {"scheduled": 3, "preempted": 1, "waiting": 2}  # chip rows per queue
ROW = 1.0  # a chip (0.6) and its note below
RING = 0.07  # the white gap between a chip's phase ring and its request colour
FIGSIZE = (9.5, 5.4)
FONT = math.ceil(2 * min_font_size(FIGSIZE[0])) / 2  # the smallest text of a frame: 10 px in the book's column
FRAME_DPI = 90  # an animation frame is 855 x 486 pixels
MAX_LABELLED_BLOCKS = 64
MAX_GRID_LINES = 40  # cells per row up to which white lines part the KV panel's cells


@dataclass(frozen=True)
class Palette:
    """What every frame of one trace shares: the colours and labels of its requests, and the blocks
    the KV panel shows (every block the trace ever used, in id order)."""

    colours: dict
    labels: dict
    blocks: np.ndarray

    @staticmethod
    def of(trace: Trace) -> Palette:
        steps = trace.require_steps()
        request_ids = list(trace.requests) + sorted({r for s in steps for r in s.blocks_held} - set(trace.requests))
        used = sorted({b for s in steps for blocks in s.blocks_held.values() for b in blocks})
        return Palette(request_colours(request_ids), request_labels(request_ids), np.array(used, dtype=int))


def _waiting(trace: Trace, step: Step) -> list[str]:
    return [r.request_id for r in trace.requests.values()
            if any(s.kind in ("queued", "preempted") and s.start <= step.end < s.end for s in r.segments)]


def _chips(ax: Axes, y: float, title: str, chips: list[tuple[str, str, str | None]], palette: Palette) -> float:
    """Rows of request chips ``(request id, note below, phase or None)`` from ``y`` down; the phase
    rings the chip. Returns the y of the next queue."""
    rows = QUEUE_ROWS[title]
    shown = rows * CHIPS_PER_ROW
    ax.text(-0.3, y + 0.3, title, ha="right", va="center", fontsize=FONT + 1)
    for i, (req_id, note, phase) in enumerate(chips[:shown]):
        x, row_y = i % CHIPS_PER_ROW, y - ROW * (i // CHIPS_PER_ROW)
        face = palette.colours.get(req_id, "0.8")
        ax.add_patch(Rectangle((x, row_y), 0.9, 0.6, facecolor="white", edgecolor=CHIP_EDGES[phase], lw=2.5))
        ax.add_patch(Rectangle((x + RING, row_y + RING), 0.9 - 2 * RING, 0.6 - 2 * RING, facecolor=face, lw=0))
        ax.text(x + 0.45, row_y + 0.3, palette.labels.get(req_id, "?"), ha="center", va="center", fontsize=FONT,
                color=text_colour(face), weight="bold")
        if note:
            ax.text(x + 0.45, row_y - 0.08, note, ha="center", va="top", fontsize=FONT)
    if len(chips) > shown:
        ax.text(-0.3, y + 0.3 - ROW * (rows - 1), f"+{len(chips) - shown} more", ha="right", va="center",
                fontsize=FONT, color="0.3")
    if not chips:
        ax.text(0, y + 0.3, "none", va="center", color="0.5", fontsize=FONT)
    used_rows = max(1, min(rows, math.ceil(len(chips) / CHIPS_PER_ROW)))
    return y - ROW * used_rows - 0.25


def _draw_queues(ax: Axes, trace: Trace, step: Step, palette: Palette) -> None:
    scheduled = [(r, f"{'D' if d else 'P'}\u2009{n}", "decode" if d else "prefill")
                 for r, n, d in zip(step.req_ids, step.req_num_tokens, step.req_is_decode)]
    y = _chips(ax, 0.0, "scheduled", scheduled, palette)
    y = _chips(ax, y, "preempted", [(r, "", "preempted") for r in step.preempted_req_ids], palette)
    _chips(ax, y, "waiting", [(r, "", "waiting") for r in _waiting(trace, step)], palette)
    ax.text(-2.7, -ROW * sum(QUEUE_ROWS.values()) - 0.3,
            "chip: request #i (arrival order); below it: P prefill or D decode, and its tokens this step\n"
            "ring: blue prefill, green decode, red preempted, grey waiting", fontsize=FONT, color="0.35", va="top")
    ax.set_xlim(-2.7, CHIPS_PER_ROW)
    ax.set_ylim(-ROW * sum(QUEUE_ROWS.values()) - 1.0, 0.75)
    ax.axis("off")
    tokens = "token" if step.num_scheduled_tokens == 1 else "tokens"
    ax.set_title(f"step {step.number}: {step.num_scheduled_tokens} {tokens}, {step.num_running_reqs} running, "
                 f"{step.num_waiting_reqs} waiting after it", loc="left", fontsize=FONT + 2)


def _draw_blocks(ax: Axes, trace: Trace, step: Step, palette: Palette) -> None:
    """The step's column of the block map, the blocks the trace ever used folded into a square grid."""
    blocks = palette.blocks
    width = max(1, math.ceil(math.sqrt(len(blocks))))
    height = max(1, math.ceil(len(blocks) / width))
    owners = step.block_owners
    image = np.ones((height, width, 4))  # cells past the last block stay white
    shared = []
    for cell, block_id in enumerate(blocks):
        holders = owners.get(int(block_id), ())
        image[cell // width, cell % width] = palette.colours.get(holders[0], FREE_BLOCK) if holders else FREE_BLOCK
        if len(holders) > 1:
            shared.append(Rectangle((cell % width - 0.5, cell // width - 0.5), 1, 1))
    ax.imshow(image, origin="upper", interpolation="nearest", extent=(-0.5, width - 0.5, height - 0.5, -0.5))
    ax.add_collection(PatchCollection(shared, facecolor="none", edgecolor="black", hatch="////", lw=0.5))
    if width <= MAX_GRID_LINES:  # white gaps between the cells, where they are big enough to see
        ax.vlines(np.arange(width + 1) - 0.5, -0.5, height - 0.5, color="white", lw=0.8)
        ax.hlines(np.arange(height + 1) - 0.5, -0.5, width - 0.5, color="white", lw=0.8)
    if len(blocks) <= MAX_LABELLED_BLOCKS:
        for cell, block_id in enumerate(blocks):
            holders = owners.get(int(block_id))
            ax.text(cell % width, cell // width, str(block_id), ha="center", va="center", fontsize=FONT,
                    color=text_colour(palette.colours.get(holders[0], "0.8")) if holders else "0.5")
    ax.axis("off")
    usable = step.num_gpu_blocks - trace.num_null_blocks  # the null block is never in use, nor free
    in_use = usable - step.num_free_blocks
    drawn = "every block" if len(blocks) == usable else f"the {len(blocks)} ever used"
    ax.set_title(f"KV blocks: {in_use} of {usable} in use\n{drawn}, by id; hatched: shared",
                 fontsize=FONT + 0.5)


def _new_frame() -> tuple[Figure, Axes, Axes]:
    """The fixed layout of a frame: the queues on the left, the KV blocks on the right."""
    figure = Figure(figsize=FIGSIZE)
    FigureCanvasAgg(figure)
    queues = figure.add_axes((0.01, 0.02, 0.6, 0.88))
    blocks = figure.add_axes((0.635, 0.03, 0.355, 0.78))
    return figure, queues, blocks


def _draw_step(queues: Axes, blocks: Axes, trace: Trace, step: Step, palette: Palette) -> None:
    queues.clear()
    blocks.clear()
    _draw_queues(queues, trace, step, palette)
    _draw_blocks(blocks, trace, step, palette)


def _step(trace: Trace, number: int) -> Step:
    steps = trace.require_steps()
    for step in steps:
        if step.number == number:
            return step
    raise ValueError(f"no engine step {number}: the trace has steps {steps[0].number}..{steps[-1].number}")


def render_step(trace: Trace, k: int) -> Figure:
    """Engine step number ``k``: its scheduled, preempted and waiting requests, and the KV blocks after it."""
    step = _step(trace, k)
    figure, queues, blocks = _new_frame()
    _draw_step(queues, blocks, trace, step, Palette.of(trace))
    return figure


def write_animation(trace: Trace, path: str, max_frames: int = 150, fps: int = 4, progress: bool = True) -> str:
    """One frame per step (at most ``max_frames``, evenly picked); an animated GIF where pillow can
    be imported, else a self-contained HTML page (``path`` with an ``.html`` suffix). A progress bar
    counts the frames unless ``progress`` is False. Returns the path written."""
    steps = trace.require_steps()
    num_frames = min(max_frames, len(steps))
    frames = [steps[round(i * (len(steps) - 1) / max(num_frames - 1, 1))] for i in range(num_frames)]
    figure, queues, blocks = _new_frame()
    figure.set_dpi(FRAME_DPI)
    palette = Palette.of(trace)
    bar = tqdm(total=num_frames, desc=f"drawing {os.path.basename(path)}", unit="frame", disable=not progress)
    with bar:
        if importlib.util.find_spec("PIL") is None:
            path = os.path.splitext(path)[0] + ".html"
            animation = FuncAnimation(figure, lambda step: _draw_step(queues, blocks, trace, step, palette),
                                      frames=frames, init_func=lambda: None,  # no extra first frame
                                      repeat=False, cache_frame_data=False)
            animation.save(path, writer=HTMLWriter(fps=fps, embed_frames=True), dpi=FRAME_DPI,
                           progress_callback=lambda i, n: bar.update(1))
            return path
        from PIL import Image

        # Drawn here rather than through FuncAnimation + PillowWriter, which draw every frame twice.
        images = []
        for step in frames:
            _draw_step(queues, blocks, trace, step, palette)
            figure.canvas.draw()
            images.append(Image.fromarray(np.asarray(figure.canvas.buffer_rgba())).convert("RGB"))
            bar.update(1)
        images[0].save(path, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    return path
