"""The pictures at server scale (100 requests, 2,000 KV blocks, 500 steps: ``synthetic.py``) stay
readable: every text lies inside its figure and no two overlap, the block map draws only the blocks
ever used and keeps its colour key, and ``report.html`` opens in a real headless browser without a
console error."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

import viz
from tests.viz.synthetic import synthetic_trace
from viz.plots import PICTURES
from viz.plots.block_map import block_grid
from viz.animation import CHIPS_PER_ROW, QUEUE_ROWS


@pytest.fixture(scope="module")
def trace():
    trace = synthetic_trace(num_requests=100, num_blocks=2000, num_steps=500)
    assert (len(trace.requests), len(trace.steps), trace.steps[0].num_gpu_blocks) == (100, 500, 2000)
    return trace


def _drawn_texts(figure: Figure) -> list[Text]:
    """The texts the figure shows: titles, labels, the tick labels in view, legends, free texts."""
    texts = list(figure.texts) + [t for legend in figure.legends for t in (legend.get_title(), *legend.get_texts())]
    for ax in figure.axes:
        texts += [*ax.texts, ax.title, ax._left_title, ax._right_title]
        if ax.axison:
            texts += [ax.xaxis.label, ax.yaxis.label]
            for axis, (low, high) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
                texts += [tick.label1 for tick in axis.get_major_ticks() if low <= tick.get_loc() <= high]
        legend = ax.get_legend()
        if legend is not None:
            texts += [legend.get_title(), *legend.get_texts()]
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def assert_readable(figure: Figure) -> list[Text]:
    """No text reaches outside the figure and no two texts' boxes overlap (1 px of slack); returns the texts."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    width, height = figure.canvas.get_width_height()
    texts = _drawn_texts(figure)
    boxes = {id(t): t.get_window_extent(renderer) for t in texts}
    outside = [t.get_text() for t in texts
               if boxes[id(t)].x0 < -1 or boxes[id(t)].y0 < -1 or boxes[id(t)].x1 > width + 1
               or boxes[id(t)].y1 > height + 1]
    assert not outside, f"texts outside the {width}x{height} figure: {outside[:10]}"
    overlapping = []
    for a, b in itertools.combinations(texts, 2):
        p, q = boxes[id(a)].padded(-1), boxes[id(b)].padded(-1)
        if p.width > 0 and q.width > 0 and p.overlaps(q):
            overlapping.append((a.get_text(), b.get_text()))
    assert not overlapping, f"{len(overlapping)} overlapping texts, e.g. {overlapping[:5]}"
    return texts


@pytest.mark.parametrize("name", list(PICTURES))
def test_picture_lays_out_its_texts_at_scale(trace, name):
    assert_readable(PICTURES[name](trace))


def test_block_map_draws_the_used_blocks_with_real_ids_and_a_key(trace):
    grid = block_grid(trace)
    used = grid.used_blocks
    assert 100 < len(used) < 2000  # a big cache is mostly never touched: the map leaves those rows out
    figure = viz.plot_kv_block_map(trace)
    texts = {t.get_text() for t in assert_readable(figure)}
    ax = figure.axes[0]
    (image,) = ax.images
    assert image.get_array().shape[:2] == (len(used), len(trace.steps))
    # The y ticks name real block ids, of used blocks only, the highest one among them.
    ticks = [int(t.get_text()) for t in ax.get_yticklabels()]
    assert set(ticks) <= set(used.tolist()) and max(ticks) == used.max()
    # The colour key: one swatch per request, named by its index in arrival order, in its colour.
    assert {f"#{i}" for i in range(len(trace.requests))} <= texts
    legends = figure.legends + [a.get_legend() for a in figure.axes if a.get_legend()]
    (key,) = [legend for legend in legends if len(legend.get_texts()) == 100]
    colours = {p.get_label(): p.get_facecolor() for p in key.legend_handles}
    assert len({tuple(np.round(c, 3)) for c in colours.values()}) == 100  # no colour repeats
    # The shared blocks are still hatched.
    assert (grid.refcount > 1).any() and any(c.get_hatch() == "////" for c in ax.collections)


def test_timeline_labels_requests_by_index(trace):
    figure = viz.plot_request_timeline(trace)
    assert_readable(figure)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert len(labels) == 100 and all(label.split()[0] == f"#{i}" for i, label in enumerate(labels))


def test_busiest_step_frame_fits_and_does_not_overlap(trace):
    busiest = max(trace.steps, key=lambda s: (s.batch_size, len(s.preempted_req_ids), s.num_waiting_reqs))
    shown = QUEUE_ROWS["scheduled"] * CHIPS_PER_ROW
    assert busiest.batch_size > shown  # more than the chips shown: "+N more"
    figure = viz.render_step(trace, busiest.number)
    texts = {t.get_text() for t in assert_readable(figure)}
    assert f"+{busiest.batch_size - shown} more" in texts
    assert not [t for t in texts if t.startswith("cmpl-")]  # short labels only
    preempting = next(s for s in trace.steps if s.preempted_req_ids)
    assert_readable(viz.render_step(trace, preempting.number))



def test_report_opens_in_a_browser_without_console_errors(trace, browser, tmp_path):
    path = viz.write_report(trace, tmp_path)
    browser.get(f"file://{path}")
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])")
    assert len(images) == len(PICTURES) and all(loaded for _, loaded in images), images
    rows = browser.execute_script("return Array.from(document.querySelectorAll('tbody tr'))"
                                  ".map(r => [r.cells[0].textContent, r.cells[1].textContent])")
    assert rows == [[f"#{i}", r] for i, r in enumerate(trace.requests)]
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors


def test_block_map_folds_unused_id_ranges_and_keeps_the_real_ids(trace):
    """Blocks 0-2 and 700-701 of 1,000 in use: five rows, ids 700 and 701 on the axis, one fold line."""
    import dataclasses

    held = [{"a": (0, 1, 2)}, {"a": (0, 1, 2), "b": (700, 701)}, {"b": (700, 701)}]
    steps = tuple(dataclasses.replace(trace.steps[10], number=i + 1, num_gpu_blocks=1000, blocks_held=h,
                                      prefix_hits={}, preempted_req_ids=()) for i, h in enumerate(held))
    small = dataclasses.replace(trace, requests={}, steps=steps)
    assert block_grid(small).used_blocks.tolist() == [0, 1, 2, 700, 701]
    figure = viz.plot_kv_block_map(small)
    assert_readable(figure)
    ax = figure.axes[0]
    assert ax.images[0].get_array().shape[:2] == (5, 3)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "700", "701"]
    assert len([line for line in ax.lines if line.get_ydata()[0] == 2.5]) == 1  # the fold between 2 and 700
    assert "995 never used" in ax.get_title()


@pytest.mark.parametrize("held, folded", [
    ([{"a": (0, 1, 2)}, {"a": (0, 1, 2), "b": (3, 4)}], False),  # ids 0-4: nothing between the rows
    ([{"a": (0, 1, 2)}, {"a": (0, 1, 2), "b": (700, 701)}], True),  # ids 3-699 folded away
], ids=["contiguous", "folded"])
def test_block_map_legend_shows_the_fold_line_only_when_one_is_drawn(trace, held, folded):
    import dataclasses

    steps = tuple(dataclasses.replace(trace.steps[10], number=i + 1, num_gpu_blocks=1000, blocks_held=h,
                                      prefix_hits={}, preempted_req_ids=()) for i, h in enumerate(held))
    figure = viz.plot_kv_block_map(dataclasses.replace(trace, requests={}, steps=steps))
    ax = figure.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert ("unused block ids folded" in legend) is folded, legend
    assert bool([line for line in ax.lines if line.get_linestyle() != "None"]) is folded
    assert "new owner (KV thrown away)" not in legend  # no block changed hands: no cross to explain
