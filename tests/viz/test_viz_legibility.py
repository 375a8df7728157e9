"""The pictures read in the book's 676-px column: every text at 10 px or more there, a chip's phase
ring always apart from its request colour, whole-number ticks where counts are drawn, and legends
that name only what was drawn."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

import viz
from tests.viz.synthetic import synthetic_trace
from tests.viz.test_viz_scale import _drawn_texts
from viz.palette import ABORT_CROSS
from viz.plots import PICTURES
from viz.plots.prediction import plot_predictions
from viz.plots.style import BOOK_COLUMN_PX, CHIP_EDGES, MIN_LABEL_PX, colour_distance, request_colours
from viz.plots.waterfall import plot_request_waterfall
from viz.plots.why import plot_why
from viz.animation import render_step


@pytest.fixture(scope="module")
def recorded(recording):
    return viz.load_trace(recording.trace_dir)


@pytest.fixture(scope="module")
def scale():
    return synthetic_trace(num_requests=100, num_blocks=2000, num_steps=500)


def _pictures(trace) -> dict[str, Figure]:
    figures = {name: plot(trace) for name, plot in PICTURES.items() if trace.worker_runs or name != "workers"}
    preempting = next(s for s in trace.steps if s.preempted_req_ids)
    figures["replay"] = render_step(trace, preempting.number)
    figures["one waterfall"] = plot_request_waterfall(trace, next(iter(trace.requests)))
    # The chapters' pictures drawn by viz for a notebook: 12-why.png and 13-whatif.png.
    figures["why"] = plot_why({"(a) one run": trace, "(b) the same run": trace})
    figures["predictions"] = plot_predictions({"(a) a run against itself": (trace, trace), "(b) again": (trace, trace)})
    return figures


def _legend_labels(figure: Figure) -> set[str]:
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend()]
    return {t.get_text() for legend in legends for t in legend.get_texts()}


@pytest.mark.parametrize("which", ["recorded", "scale"])
def test_every_text_is_at_least_10_px_in_the_book_column(which, request):
    for name, figure in _pictures(request.getfixturevalue(which)).items():
        figure.canvas.draw()
        # The book shows the picture as saved (bbox_inches="tight": a legend outside widens it).
        saved_inches = max(figure.get_figwidth(), figure.get_tightbbox().width)
        scale = BOOK_COLUMN_PX / (72 * saved_inches)
        small = {t.get_text(): round(t.get_fontsize() * scale, 1) for t in _drawn_texts(figure)
                 if t.get_fontsize() * scale < MIN_LABEL_PX - 1e-6}
        assert not small, f"{name}: texts under {MIN_LABEL_PX} px at {BOOK_COLUMN_PX} px wide: {small}"


@pytest.mark.parametrize("num_requests", [1, 5, 13, 14, 100, 500])
def test_no_request_colour_comes_near_a_chip_edge(num_requests):
    colours = list(request_colours([f"r{i}" for i in range(num_requests)]).values())
    assert len({tuple(np.round(c, 4)) for c in colours}) == num_requests
    for colour in colours:
        for phase, edge in CHIP_EDGES.items():
            assert colour_distance(colour, edge) >= 35, (colour, phase)


def test_each_chip_shows_its_ring_apart_from_its_fill(scale, recorded):
    """A chip is a white rectangle ringed in the phase's colour with the request's colour inside."""
    frames = [render_step(recorded, recorded.steps[0].number)]  # prefill chunks
    frames += [render_step(recorded, s.number) for s in recorded.steps if s.preempted_req_ids][:2]
    busiest = max(scale.steps, key=lambda s: (s.batch_size, s.num_waiting_reqs))
    frames.append(render_step(scale, busiest.number))
    edges = {tuple(to_rgba(c)): phase for phase, c in CHIP_EDGES.items()}
    seen = set()
    for figure in frames:
        patches = figure.axes[0].patches
        rings = [i for i, p in enumerate(patches) if tuple(p.get_facecolor()) == (1, 1, 1, 1)]
        assert rings
        for i in rings:
            ring, fill = patches[i], patches[i + 1]
            seen.add(edges[tuple(ring.get_edgecolor())])
            assert colour_distance(ring.get_edgecolor(), fill.get_facecolor()) >= 35
    assert seen == {"prefill", "decode", "preempted", "waiting"}


def _integer_ticks(axis, low, high) -> bool:
    ticks = [t for t in axis.get_ticklocs() if low <= t <= high]
    return bool(ticks) and all(float(t).is_integer() for t in ticks)


def test_counts_have_whole_number_ticks(recorded):
    composition = viz.plot_step_composition(recorded)
    tokens, batch = composition.axes
    assert max(s.batch_size for s in recorded.steps) <= 8  # few enough that a default axis ticks halves
    assert _integer_ticks(batch.yaxis, *batch.get_ylim()) and _integer_ticks(tokens.yaxis, *tokens.get_ylim())
    gauges = viz.plot_engine_gauges(recorded)
    (queues,) = [ax for ax in gauges.axes if ax.get_ylabel() == "requests"]
    assert _integer_ticks(queues.yaxis, *queues.get_ylim())


def _without_preemptions(trace):
    steps = tuple(dataclasses.replace(s, preempted_req_ids=()) for s in trace.steps)
    requests = {r: dataclasses.replace(q, segments=tuple(s for s in q.segments if s.kind != "preempted"))
                for r, q in trace.requests.items()}
    return dataclasses.replace(trace, steps=steps, requests=requests)


@pytest.mark.parametrize("preempted", [True, False], ids=["with preemptions", "without"])
def test_legends_name_only_what_is_drawn(recorded, preempted):
    trace = recorded if preempted else _without_preemptions(recorded)
    timeline = _legend_labels(viz.plot_request_timeline(trace))
    kinds = {s.kind for r in trace.requests.values() for s in r.segments}
    assert timeline == kinds | {"first token (TTFT)"}
    assert ("preempted" in timeline) is preempted

    composition = _legend_labels(viz.plot_step_composition(trace))
    assert ("step with a preemption" in composition) is preempted
    assert "token budget" in composition  # 32 tokens: on the scale
    block_map = _legend_labels(viz.plot_kv_block_map(trace))
    assert ("step with a preemption" in block_map) is preempted


def test_an_off_scale_budget_is_written_not_listed(scale):
    figure = viz.plot_step_composition(scale)
    assert "token budget" not in _legend_labels(figure)
    assert any(t.get_text().startswith("token budget 2048 (above the scale)") for t in figure.axes[0].texts)
    # No block changed hands in the synthetic run's big cache: no cross, and none in the legend.
    assert "new owner (KV thrown away)" not in _legend_labels(viz.plot_kv_block_map(scale))


def test_an_abort_is_a_cross_in_the_palette_s_colour_and_in_the_legend(scale):
    first = next(iter(scale.requests.values()))
    trace = dataclasses.replace(scale, requests={**scale.requests, first.request_id: dataclasses.replace(
        first, finish_reason="abort")})
    figure = viz.plot_request_timeline(trace)
    assert "aborted" in _legend_labels(figure)
    (cross,) = [line for line in figure.axes[0].lines if line.get_marker() == "X"]
    assert to_rgba(cross.get_color()) == to_rgba(ABORT_CROSS) and len(cross.get_xdata()) == 1
