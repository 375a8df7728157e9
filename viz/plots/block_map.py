"""The KV-block map: x = engine step, y = physical block id, colour = the request holding the block
once the step is over (``Step.blocks_held``).

A block held by more than one request (shared through the prefix cache) is hatched, and coloured
by the holder that came first. A cross marks a block taken by a request that did not hold it the
last time it was in use, other than through a prefix-cache hit: the KV it held was thrown away (a
finished or preempted request's block reused, a cached block evicted). A request that gets cached
blocks back (its own after a preemption, or another's through a prefix hit) gets no cross.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from viz.model import Trace
from viz.plots.style import FREE_BLOCK, PREEMPTION, new_figure, request_colours

MAX_LEGEND_REQUESTS = 16


@dataclass(frozen=True)
class BlockGrid:
    """The block map as arrays of shape ``(num blocks, num steps)``; column j is ``trace.steps[j]``."""

    request_ids: list[str]  # the index space of ``owner``
    owner: np.ndarray  # index of the first holder, -1 for a free block
    refcount: np.ndarray
    new_owner: np.ndarray  # bool: held by new requests, not from the prefix cache (its KV thrown away)

    def rgba(self, colours: dict) -> np.ndarray:
        palette = np.array([colours[r] for r in self.request_ids] + [FREE_BLOCK])
        return palette[self.owner]  # -1 picks FREE_BLOCK, the last row


def block_grid(trace: Trace) -> BlockGrid:
    steps = trace.require_steps()
    request_ids = list(trace.requests) + sorted({r for s in steps for r in s.blocks_held} - set(trace.requests))
    index = {r: i for i, r in enumerate(request_ids)}
    shape = (max(s.num_gpu_blocks for s in steps), len(steps))
    owner, refcount = np.full(shape, -1), np.zeros(shape, dtype=int)
    new_owner = np.zeros(shape, dtype=bool)
    last_holders: dict[int, set[str]] = {}
    for j, step in enumerate(steps):
        hits = {block_id for blocks in step.prefix_hits.values() for block_id in blocks}
        for block_id, holders in step.block_owners.items():
            owner[block_id, j] = min(index[r] for r in holders)
            refcount[block_id, j] = len(holders)
            before = last_holders.get(block_id)
            new_owner[block_id, j] = before is not None and not before & set(holders) and block_id not in hits
            last_holders[block_id] = set(holders)
    return BlockGrid(request_ids, owner, refcount, new_owner)


def _shared_runs(grid: BlockGrid, x0: float) -> PatchCollection:
    """One hatched rectangle per run of steps in which a block stays shared."""
    boxes = []
    for block_id, row in enumerate(grid.refcount > 1):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(int), [0]])))
        boxes += [Rectangle((x0 + a - 0.5, block_id - 0.5), b - a, 1) for a, b in zip(edges[0::2], edges[1::2])]
    return PatchCollection(boxes, facecolor="none", edgecolor="black", hatch="////", linewidth=0.6)


def draw_block_map(ax: Axes, trace: Trace, grid: BlockGrid, colours: dict) -> None:
    steps = trace.steps
    x0 = steps[0].number
    num_blocks, num_steps = grid.owner.shape
    ax.imshow(grid.rgba(colours), origin="lower", aspect="auto", interpolation="nearest",
              extent=(x0 - 0.5, x0 + num_steps - 0.5, -0.5, num_blocks - 0.5))
    ax.add_collection(_shared_runs(grid, x0))
    blocks, columns = np.nonzero(grid.new_owner)
    ax.scatter(x0 + columns, blocks, marker="x", s=14, color="black", linewidths=0.8, zorder=3)
    preempted = [s.number for s in steps if s.preempted_req_ids]
    ax.plot(preempted, [1.0] * len(preempted), "v", color=PREEMPTION, ms=7, clip_on=False,
            transform=ax.get_xaxis_transform())
    if num_blocks <= 64:
        ax.set_yticks(np.arange(num_blocks))
        ax.set_yticks(np.arange(num_blocks) - 0.5, minor=True)
        ax.grid(which="minor", axis="y", color="white", lw=0.8)
        ax.tick_params(which="minor", length=0)
    ax.set_xlabel("engine step")
    ax.set_ylabel("physical KV block id")


def plot_kv_block_map(trace: Trace) -> Figure:
    grid = block_grid(trace)
    colours = request_colours(grid.request_ids)
    num_blocks = grid.owner.shape[0]
    figure = new_figure(11, min(3 + 0.2 * num_blocks, 14))
    ax = figure.add_subplot()
    draw_block_map(ax, trace, grid, colours)
    ax.set_title(f"KV blocks after each step: {num_blocks} blocks, {len(trace.steps)} steps", pad=12)
    handles = [Patch(facecolor=FREE_BLOCK, edgecolor="0.7", label="free"),
               Patch(facecolor="white", edgecolor="black", hatch="////", label="shared (prefix cache)"),
               Line2D([], [], marker="x", ls="", color="black", label="new owner (KV thrown away)"),
               Line2D([], [], marker="v", ls="", color=PREEMPTION, label="step with a preemption")]
    if len(grid.request_ids) <= MAX_LEGEND_REQUESTS:
        handles += [Patch(color=colours[r], label=f"request {r}") for r in grid.request_ids]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
              title=None if len(grid.request_ids) <= MAX_LEGEND_REQUESTS else "colour: request")
    return figure
