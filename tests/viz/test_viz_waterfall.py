"""``viz/plots/waterfall.py``: a request's spans found in its trace, and drawn one row each."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from matplotlib.collections import PolyCollection

import viz
from tracevllm.tracing.schema import STEP_STAGES, Attr
from tests.viz.synthetic import synthetic_trace
from viz.plots.waterfall import (ENGINE_STEPS, plot_request_waterfall, plot_request_waterfalls, request_spans,
                                 step_stages)


def _bars(ax) -> int:
    return sum(len(c.get_paths()) for c in ax.collections if isinstance(c, PolyCollection))


def test_one_request_has_its_spans_in_tree_order_and_its_steps_by_stage(recording):
    trace = viz.load_trace(recording.trace_dir)
    request = next(iter(trace.requests.values()))
    rows = request_spans(trace, request)
    assert [r.span.name for r in rows] == ["llm_request", "tokenize", "scheduler.request", "prefill", "decode",
                                          "detokenize"]
    assert [r.depth for r in rows] == [0, 1, 1, 1, 1, 1]
    figure = plot_request_waterfall(trace, request.request_id)
    ax = figure.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["llm_request", "tokenize", "scheduler.request (core)", "prefill", "decode", "detokenize",
                      f"{ENGINE_STEPS} (core)"]
    # A bar per span, the scheduler.request one cut into the request's segments, four per engine step.
    assert _bars(ax) == len(rows) - 1 + len(request.segments) + len(STEP_STAGES) * len(request.chunks)
    # The legend names exactly what was drawn.
    legend = {t.get_text() for t in figure.legends[0].get_texts()}
    kinds = {s.kind for s in request.segments} | {"prefill", "decode"}
    assert legend == kinds | {"other span", "span event"} | {f"stage: {s}" for s in STEP_STAGES}


def test_each_sample_of_n_gets_only_its_own_spans(multiprocess_dir):
    """n=2: one llm_request, two engine-core requests; each waterfall leaves out the other sample's."""
    trace = viz.load_trace(multiprocess_dir)
    assert len(trace.requests) == 2
    for request in trace.requests.values():
        rows = request_spans(trace, request)
        names = [r.span.name for r in rows]
        assert names.count("llm_request") == names.count("scheduler.request") == names.count("decode") == 1
        assert all(r.span.attributes.get(Attr.REQUEST_ID, request.request_id) == request.request_id for r in rows)
        engine_core = [r.span.process.name for r in rows if r.span.name == "scheduler.request"]
        assert engine_core == ["EngineCore"]


def test_request_level_trace_has_no_engine_steps_row(request_level_dir):
    trace = viz.load_trace(request_level_dir)
    assert step_stages(trace) == {}
    figure = plot_request_waterfalls(trace)
    assert len(figure.axes) == len(trace.requests)
    for ax in figure.axes:
        assert not any(ENGINE_STEPS in t.get_text() for t in ax.get_yticklabels())


def test_unknown_request_is_a_value_error(recording):
    trace = viz.load_trace(recording.trace_dir)
    with pytest.raises(ValueError, match="no request 'nope'"):
        plot_request_waterfall(trace, "nope")


def _step_labels(ax):
    return [t for t in ax.texts if t.get_text().isdigit()]  # the engine steps' numbers


def _long_first_step(trace):
    """The trace with its first request's first step stretched over 80 % of its engine-core time, the
    others squeezed into the rest: a served run's long prefill, then fast decodes."""
    request = next(iter(trace.requests.values()))
    first, *rest = request.chunks
    start, end = first.start, request.chunks[-1].end
    cut = start + 0.8 * (end - start)
    squeezed = [dataclasses.replace(c, start=cut + (c.start - first.end) * (end - cut) / (end - first.end),
                                    end=cut + (c.end - first.end) * (end - cut) / (end - first.end)) for c in rest]
    chunks = (dataclasses.replace(first, end=cut), *squeezed)
    return dataclasses.replace(trace, requests={**trace.requests, request.request_id: dataclasses.replace(
        request, chunks=chunks)})


@pytest.mark.parametrize("which", ["recorded", "synthetic"])
def test_step_numbers_never_overlap_and_every_time_is_in_ms(which, recording):
    trace = viz.load_trace(recording.trace_dir) if which == "recorded" else synthetic_trace(100, 2000, 500)
    first = next(iter(trace.requests))
    figures = [plot_request_waterfalls(trace, max_requests=3), plot_request_waterfall(trace, first),
               plot_request_waterfall(_long_first_step(trace), first)]
    for figure in figures:
        figure.savefig(io.BytesIO(), dpi=110, bbox_inches="tight")  # as the book and the report save it
        renderer = figure.canvas.get_renderer()
        for ax in figure.axes:
            boxes = sorted((t.get_window_extent(renderer) for t in _step_labels(ax)), key=lambda b: b.x0)
            if any(t.get_text() == ENGINE_STEPS + " (core)" for t in ax.get_yticklabels()):
                assert boxes, "an engine-steps row without a single step number"
            for left, right in zip(boxes, boxes[1:]):
                assert left.x1 <= right.x0, (which, [t.get_text() for t in _step_labels(ax)])
            notes = [t.get_text().strip() for t in ax.texts if not t.get_text().isdigit()]
            assert notes and all(re.fullmatch(r"[\d,.]+ ms", n) for n in notes), notes
            assert "ms" in ax.get_xlabel() or not ax.get_xlabel()
