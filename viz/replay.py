"""Replaying a trace step by step, for notebooks: ``render_step(trace, k)`` draws engine step ``k``,
``write_animation(trace, path)`` all of them (an animated GIF, or a self-contained HTML page).

A frame::

    step 25: 2 running, 1 waiting, 1 of 16 blocks free        | KV blocks after the step
    scheduled  [1 P9] [2 P21]      (request, prefill/decode, tokens)  |  0  1  2  3
    preempted  -                                                 |  4  5  6  7   colour = request,
    waiting    [3]                                               |  ...          hatched = shared

The scheduled and preempted requests and the counts come from the step's attributes; the waiting
requests' names from the requests' segments (waiting when a queued or preempted segment covers the
step's end), since a step records only how many wait.
"""

from __future__ import annotations

import importlib.util
import math
import os

from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from viz.model import Step, Trace
from viz.plots.style import FREE_BLOCK, PHASE_COLOURS, new_figure, request_colours

MAX_CHIPS = 12


def _waiting(trace: Trace, step: Step) -> list[str]:
    return [r.request_id for r in trace.requests.values()
            if any(s.kind in ("queued", "preempted") and s.start <= step.end < s.end for s in r.segments)]


def _chips(ax: Axes, y: float, title: str, chips: list[tuple[str, str, str | None]], colours: dict) -> None:
    """A row of request chips: ``(request id, text below, phase or None)``; the phase colours the edge."""
    ax.text(-0.2, y + 0.3, title, ha="right", va="center")
    for i, (req_id, note, phase) in enumerate(chips[:MAX_CHIPS]):
        edge = PHASE_COLOURS[phase] if phase else "0.3"
        ax.add_patch(Rectangle((i, y), 0.9, 0.6, facecolor=colours.get(req_id, "0.8"), edgecolor=edge, lw=3))
        ax.text(i + 0.45, y + 0.3, req_id, ha="center", va="center", fontsize=9, color="white", weight="bold")
        ax.text(i + 0.45, y - 0.12, note, ha="center", va="top", fontsize=7)
    if len(chips) > MAX_CHIPS:
        ax.text(MAX_CHIPS + 0.1, y + 0.3, f"+{len(chips) - MAX_CHIPS} more", va="center")
    if not chips:
        ax.text(0, y + 0.3, "none", va="center", color="0.5")


def _draw_queues(ax: Axes, trace: Trace, step: Step, colours: dict) -> None:
    scheduled = [(r, f"{'decode' if d else 'prefill'} {n}", "decode" if d else "prefill")
                 for r, n, d in zip(step.req_ids, step.req_num_tokens, step.req_is_decode)]
    _chips(ax, 2.2, "scheduled", scheduled, colours)
    _chips(ax, 1.1, "preempted", [(r, "", "preempted") for r in step.preempted_req_ids], colours)
    _chips(ax, 0.0, "waiting", [(r, "", None) for r in _waiting(trace, step)], colours)
    ax.text(0, -0.55, "edge: blue = prefill, green = decode, red = preempted; colour = request", fontsize=8,
            color="0.4")
    ax.set_xlim(-0.1, MAX_CHIPS + 1.5)
    ax.set_ylim(-0.7, 3.0)
    ax.axis("off")
    tokens = "token" if step.num_scheduled_tokens == 1 else "tokens"
    ax.set_title(f"step {step.number}: {step.num_scheduled_tokens} {tokens}, {step.num_running_reqs} running, "
                 f"{step.num_waiting_reqs} waiting after it", loc="left")


def _draw_blocks(ax: Axes, step: Step, colours: dict) -> None:
    """The step's column of the block map, folded into a square grid (block ids row by row)."""
    num_blocks = step.num_gpu_blocks
    width = math.ceil(math.sqrt(num_blocks))
    owners = step.block_owners
    for block_id in range(num_blocks):
        x, y = block_id % width, -(block_id // width)
        holders = owners.get(block_id, ())
        face = colours.get(holders[0], "0.8") if holders else FREE_BLOCK
        ax.add_patch(Rectangle((x, y), 0.92, 0.92, facecolor=face, edgecolor="black" if len(holders) > 1 else "none",
                               hatch="////" if len(holders) > 1 else None, lw=0.6))
        if num_blocks <= 64:
            ax.text(x + 0.46, y + 0.46, str(block_id), ha="center", va="center", fontsize=7,
                    color="white" if holders else "0.5")
    ax.set_xlim(-0.1, width)
    ax.set_ylim(-(num_blocks - 1) // width - 0.1, 1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"KV blocks: {step.num_free_blocks} of {num_blocks} free "
                 f"({100 * step.kv_cache_usage:.0f} % used)")


def _draw_step(figure: Figure, trace: Trace, step: Step, colours: dict) -> None:
    figure.clear()
    queues, blocks = figure.subplots(1, 2, width_ratios=[2.2, 1])
    _draw_queues(queues, trace, step, colours)
    _draw_blocks(blocks, step, colours)


def _step(trace: Trace, number: int) -> Step:
    steps = trace.require_steps()
    for step in steps:
        if step.number == number:
            return step
    raise ValueError(f"no engine step {number}: the trace has steps {steps[0].number}..{steps[-1].number}")


def render_step(trace: Trace, k: int) -> Figure:
    """Engine step number ``k``: its scheduled, preempted and waiting requests, and the KV blocks after it."""
    figure = new_figure(11, 4)
    _draw_step(figure, trace, _step(trace, k), request_colours(trace.requests))
    return figure


def write_animation(trace: Trace, path: str, max_frames: int = 150, fps: int = 4) -> str:
    """One frame per step (at most ``max_frames``, evenly picked); an animated GIF where pillow can
    be imported, else a self-contained HTML page (``path`` with an ``.html`` suffix). Returns the path
    written."""
    steps = trace.require_steps()
    num_frames = min(max_frames, len(steps))
    frames = [steps[round(i * (len(steps) - 1) / max(num_frames - 1, 1))] for i in range(num_frames)]
    figure = new_figure(11, 4)
    colours = request_colours(trace.requests)
    animation = FuncAnimation(figure, lambda step: _draw_step(figure, trace, step, colours), frames=frames,
                              interval=1000 / fps, repeat=False, cache_frame_data=False)
    if importlib.util.find_spec("PIL") is None:  # PillowWriter needs pillow
        path = os.path.splitext(path)[0] + ".html"
        with open(path, "w", encoding="utf-8") as f:
            f.write(animation.to_jshtml(fps=fps))
        return path
    animation.save(path, writer=PillowWriter(fps=fps))
    return path
