"""The workers' timeline (tensor or pipeline parallelism): one row per rank, grouped by pipeline
stage, and a bar for each batch that rank ran (``worker.execute_model``), coloured by the engine step
that scheduled the batch and labelled with its number. The part of a bar spent waiting for the
previous stage's tensors is hatched.

With ``pipeline_parallel_size`` 2 the batch queue shows as staircases: batch k runs on stage 1 while
batch k + 1 runs on stage 0. The hatched starts are the pipeline's bubbles.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from viz.model import Trace
from viz.plots.style import FIGURE_WIDTH, REQUEST_COLOURS, new_figure, text_colour

ROW_HEIGHT = 0.7


def plot_pipeline(trace: Trace) -> Figure:
    runs = trace.worker_runs
    if not runs:
        raise ValueError(f"{trace.directory}: no worker.execute_model spans: the model ran in one process "
                         "(tensor_parallel_size and pipeline_parallel_size 1), or steps were not traced")
    ranks = sorted({(r.pp_rank, r.tp_rank, r.rank) for r in runs})
    row_of = {rank: row for row, (_, _, rank) in enumerate(ranks)}
    figure = new_figure(FIGURE_WIDTH, 2.0 + 0.55 * len(ranks))
    ax = figure.add_subplot()
    span = max(r.end for r in runs) - min(r.start for r in runs)
    for run in runs:
        row = row_of[run.rank]
        colour = REQUEST_COLOURS[(run.step or 0) % len(REQUEST_COLOURS)]
        ax.broken_barh([(run.start, run.end - run.start)], (row - ROW_HEIGHT / 2, ROW_HEIGHT), facecolors=colour)
        if run.recv > 0:
            ax.broken_barh([(run.start, run.recv)], (row - ROW_HEIGHT / 2, ROW_HEIGHT), facecolors="white",
                           edgecolors=colour, hatch="////", linewidth=0)
        if run.step is not None and run.end - run.start > span / 40:
            ax.text((run.start + run.end) / 2, row, str(run.step), ha="center", va="center", fontsize=9,
                    color=text_colour(colour), clip_on=True)
    ax.set_yticks(range(len(ranks)), [f"stage {pp} · tp {tp} (rank {rank})" for pp, tp, rank in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlabel("time since the first span (s)")
    stages = len({pp for pp, _, _ in ranks})
    ax.set_title(f"Workers: {len(ranks)} ranks, {stages} pipeline stage{'s' if stages > 1 else ''}, "
                 f"{len({r.step for r in runs})} batches\n(numbered by the engine step that scheduled them)")
    ax.grid(axis="x", alpha=0.3)
    if any(run.recv > 0 for run in runs):
        wait = Patch(facecolor="white", edgecolor="0.3", hatch="////", label="waiting for the previous stage")
        figure.legend(handles=[wait], loc="outside lower center", frameon=False)
    return figure
