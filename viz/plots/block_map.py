"""The KV-block map: x = engine step, y = physical block id, colour = the request holding the block
once the step is over (``Step.blocks_held``).

A block held by more than one request (shared through the prefix cache) is hatched, and coloured
by the holder that came first. A cross marks a block taken by a request that did not hold it the
last time it was in use, other than through a prefix-cache hit: the KV it held was thrown away (a
finished or preempted request's block reused, a cached block evicted). A request that gets cached
blocks back (its own after a preemption, or another's through a prefix hit) gets no cross.

A server's cache has far more blocks than a run ever touches (1,456 for 275 used), so the map has a
row for each block that was ever in use, not for every block: the y axis keeps the real block ids,
and a thin grey line marks where a range of never-used ids was folded away. A request is named by
its index in arrival order (``#7``), which the colour key and the report's table resolve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.transforms import ScaledTranslation

from viz.model import Trace
from viz.plots.style import FIGURE_WIDTH, FREE_BLOCK, PREEMPTION, new_figure, request_colours, request_labels

MAX_KEY_REQUESTS = 400  # beyond this a colour key is a wall of swatches (20 rows of 20)
MAX_FOLD_LINES = 40  # more folds than this are drawn as none (the ids are scattered, not in ranges)
MAX_Y_TICKS = 24


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

    @property
    def used_blocks(self) -> np.ndarray:
        """The ids of the blocks held after at least one step, ascending: the map's rows."""
        return np.flatnonzero((self.owner >= 0).any(axis=1))


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


def _shared_runs(refcount: np.ndarray, x0: float, row_points: float) -> PatchCollection:
    """One hatched rectangle per run of steps in which a block (a row of ``refcount``) stays shared.
    Rows a few points high get a thinner, lighter hatch and no outline, which would hide their colour."""
    boxes = []
    for row, shared in enumerate(refcount > 1):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], shared.astype(int), [0]])))
        boxes += [Rectangle((x0 + a - 0.5, row - 0.5), b - a, 1) for a, b in zip(edges[0::2], edges[1::2])]
    thin = row_points < 4
    return PatchCollection(boxes, facecolor="none", edgecolor=(0, 0, 0, 0.45 if thin else 1.0), hatch="////",
                           linewidth=0 if thin else 0.6)


def _block_id_axis(ax: Axes, used: np.ndarray) -> bool:
    """Ticks labelled with the real ids of the rows' blocks, and a line at each folded range.
    Returns whether it drew any such line."""
    if len(used) <= 64:
        ax.set_yticks(np.arange(len(used)), [str(b) for b in used])
        ax.set_yticks(np.arange(len(used)) - 0.5, minor=True)
        ax.grid(which="minor", axis="y", color="white", lw=0.8)
        ax.tick_params(which="minor", length=0)
    else:
        rows = np.unique(np.linspace(0, len(used) - 1, MAX_Y_TICKS).round().astype(int))
        ax.set_yticks(rows, [str(b) for b in used[rows]])
    folds = np.flatnonzero(np.diff(used) > 1)
    if len(folds) > MAX_FOLD_LINES:
        return False
    for row in folds:
        ax.axhline(row + 0.5, color="0.45", lw=0.6, ls=(0, (4, 2)))
    return len(folds) > 0


def draw_block_map(ax: Axes, trace: Trace, grid: BlockGrid, colours: dict) -> bool:
    """The map of the blocks ever used (``grid.used_blocks``), one row each, one column per step.
    Returns whether it drew a fold line (ids never used lie between two rows)."""
    steps = trace.steps
    x0 = steps[0].number
    used = grid.used_blocks
    num_steps = grid.owner.shape[1]
    owner, refcount = grid.owner[used], grid.refcount[used]
    rows = BlockGrid(grid.request_ids, owner, refcount, grid.new_owner[used])
    ax.imshow(rows.rgba(colours), origin="lower", aspect="auto", interpolation="nearest",
              extent=(x0 - 0.5, x0 + num_steps - 0.5, -0.5, len(used) - 0.5))
    # Cell sizes in points, from the axes' size before the layout (close enough to size the marks).
    box = ax.get_position()
    width, height = ax.figure.get_size_inches()
    row_points = 72 * height * box.height / max(len(used), 1)
    ax.add_collection(_shared_runs(refcount, x0, row_points))
    # A cross fills about a cell, however many cells there are (up to the 14 pt² a few blocks get).
    cell = min(72 * width * box.width / num_steps, row_points)
    crosses, columns = np.nonzero(rows.new_owner)
    ax.scatter(x0 + columns, crosses, marker="x", s=min(14.0, (0.8 * cell) ** 2), color="black",
               linewidths=0.8 if cell > 3 else 0.4, zorder=3)
    preempted = [s.number for s in steps if s.preempted_req_ids]
    if preempted:  # an empty unclipped line would still stretch the layout to the figure's corner
        ax.plot(preempted, [1.0] * len(preempted), "v", color=PREEMPTION, ms=7, clip_on=False,
                transform=ax.get_xaxis_transform())
    fold_lines = _block_id_axis(ax, used)
    ax.set_ylim(-0.5, len(used) - 0.5)
    ax.set_xlabel("engine step")
    ax.set_ylabel("physical KV block id (blocks ever used)")
    return fold_lines


def plot_kv_block_map(trace: Trace) -> Figure:
    grid = block_grid(trace)
    colours = request_colours(grid.request_ids)
    labels = request_labels(grid.request_ids)
    num_blocks = grid.owner.shape[0] - trace.num_null_blocks  # the null block holds no KV: not counted
    num_used = len(grid.used_blocks)
    num_requests = len(grid.request_ids)
    key_columns = 12
    key_rows = -(-num_requests // key_columns) if num_requests <= MAX_KEY_REQUESTS else 0
    map_height, key_height = min(3 + 0.2 * num_used, 16), 0.5 + 0.2 * key_rows
    figure = new_figure(FIGURE_WIDTH, 0.6 + map_height + key_height * bool(key_rows))
    ax = figure.add_subplot()
    fold_lines = draw_block_map(ax, trace, grid, colours)
    folded = "" if num_used == num_blocks else f"\n{num_blocks - num_used} never used: not drawn"
    no_key = "" if key_rows else f"\ncolour: {num_requests} requests, too many for a key (see the report's table)"
    ax.set_title(f"KV blocks after each step: {num_used} of {num_blocks} blocks used, {len(trace.steps)} steps"
                 f"{folded}{no_key}", pad=12)
    drawn = {"free": (grid.owner[grid.used_blocks] < 0).any(), "shared": (grid.refcount > 1).any(),
             "new owner": grid.new_owner.any(), "preemption": any(s.preempted_req_ids for s in trace.steps),
             "fold": fold_lines}
    marks = [Patch(facecolor=FREE_BLOCK, edgecolor="0.7", label="free"),
             Patch(facecolor="white", edgecolor="black", hatch="////", label="shared (prefix cache)"),
             Line2D([], [], marker="x", ls="", color="black", label="new owner (KV thrown away)"),
             Line2D([], [], marker="v", ls="", color=PREEMPTION, label="step with a preemption"),
             Line2D([], [], color="0.45", lw=0.6, ls=(0, (4, 2)), label="unused block ids folded")]
    marks = [mark for mark, shown in zip(marks, drawn.values()) if shown]
    if marks:
        below_xlabel = ax.transAxes + ScaledTranslation(0, -36 / 72, figure.dpi_scale_trans)
        ax.legend(handles=marks, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below_xlabel, ncol=3,
                  frameon=False, fontsize=9)
    if key_rows:
        swatches = [Patch(color=colours[r], label=labels[r]) for r in grid.request_ids]
        figure.legend(handles=swatches, loc="outside lower center", ncol=min(num_requests, key_columns), fontsize=9,
                      frameon=False, handlelength=1.2, handletextpad=0.4, columnspacing=0.8,
                      title="colour: request (# in arrival order; full ids in the report's table)",
                      title_fontsize=9)
    return figure
