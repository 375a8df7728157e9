"""The pictures and the step replay on real traces: each returns a Figure with something drawn, and saves."""

from __future__ import annotations

import importlib.util

import pytest
from matplotlib.figure import Figure

import viz
from viz.plots import PICTURES


@pytest.fixture(scope="module")
def trace(recording):
    return viz.load_trace(recording.trace_dir)


def _drawn(figure: Figure) -> int:
    """How many data artists (bars, lines, images, collections) the figure's axes hold."""
    return sum(len(ax.patches) + len(ax.lines) + len(ax.images) + len(ax.collections) for ax in figure.axes)


# The recording ran on one process: the workers' timeline (several ranks) has nothing to draw.
@pytest.mark.parametrize("name", [name for name in PICTURES if name != "workers"])
def test_picture_draws_and_saves(trace, name, tmp_path):
    figure = PICTURES[name](trace)
    assert isinstance(figure, Figure) and _drawn(figure) > 0
    figure.savefig(tmp_path / f"{name}.png")
    assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_workers_picture_says_why_a_single_process_run_has_none(trace):
    with pytest.raises(ValueError, match="ran in one process"):
        PICTURES["workers"](trace)


def test_timeline_has_a_bar_per_segment_and_a_ttft_mark_per_request(trace):
    from matplotlib.collections import PolyCollection

    ax = viz.plot_request_timeline(trace).axes[0]
    bars = sum(len(c.get_paths()) for c in ax.collections if isinstance(c, PolyCollection))
    assert bars == sum(len(r.segments) for r in trace.requests.values())
    (marks,) = [line for line in ax.lines if line.get_marker() == "D"]
    assert len(marks.get_xdata()) == len(trace.requests)


def test_block_map_marks_the_shared_blocks(trace):
    from viz.plots.block_map import block_grid

    grid = block_grid(trace)
    assert grid.owner.shape == (17, len(trace.steps))  # 16 blocks and the null block, block 0
    assert (grid.refcount > 1).any() and grid.new_owner.any()
    # In use after each step: exactly the blocks the steps say are not free (the null block is neither).
    assert ((grid.owner >= 0).sum(axis=0) == [16 - s.num_free_blocks for s in trace.steps]).all()
    assert (grid.owner[0] < 0).all()
    # A block taken from the prefix cache kept its KV: no cross on it in that step.
    hits = [(b, j) for j, s in enumerate(trace.steps) for blocks in s.prefix_hits.values() for b in blocks]
    assert hits and not any(grid.new_owner[b, j] for b, j in hits)


def test_step_pictures_need_steps_but_gauges_and_timeline_do_not(request_level_dir):
    trace = viz.load_trace(request_level_dir)
    for plot in (viz.plot_kv_block_map, viz.plot_step_composition, lambda t: viz.render_step(t, 1)):
        with pytest.raises(ValueError, match="--trace-level request"):
            plot(trace)
    assert _drawn(viz.plot_request_timeline(trace)) > 0
    gauges = viz.plot_engine_gauges(trace)  # only the panels the requests fill, and the title says why
    assert [ax.get_ylabel() for ax in gauges.axes] == ["prefix hits (%)", "output tok/s"]
    assert "--trace-level request" in gauges.get_suptitle()


def test_render_step_shows_the_step(trace):
    preempting = next(s for s in trace.steps if s.preempted_req_ids)
    figure = viz.render_step(trace, preempting.number)
    texts = {t.get_text() for ax in figure.axes for t in ax.texts}
    labels = {r: f"#{i}" for i, r in enumerate(trace.requests)}
    assert {labels[r] for r in preempting.req_ids + preempting.preempted_req_ids} <= texts
    assert any(f"step {preempting.number}:" in ax.get_title(loc="left") for ax in figure.axes)
    with pytest.raises(ValueError, match="no engine step 9999"):
        viz.render_step(trace, 9999)


def test_write_animation_writes_a_gif_or_without_pillow_html(trace, tmp_path, monkeypatch):
    from PIL import Image

    path = viz.write_animation(trace, str(tmp_path / "steps.gif"), max_frames=3, progress=False)
    with Image.open(path) as gif:
        assert gif.format == "GIF" and gif.n_frames == 3

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else find_spec(name, *a))
    path = viz.write_animation(trace, str(tmp_path / "steps.gif"), max_frames=2, progress=False)
    assert path == str(tmp_path / "steps.html")
    assert open(path).read().count("data:image/png;base64,") == 2


def test_an_aborted_request_is_marked_aborted_in_the_timeline(tiny_checkpoint, tmp_path):
    from tracevllm import LLM, SamplingParams
    from tracevllm.tracing import flush_traces

    llm = LLM(tiny_checkpoint("llama"), dtype="float32", trace_out=str(tmp_path))
    engine = llm.llm_engine
    engine.add_request("kept", "one two three", SamplingParams(max_tokens=6, ignore_eos=True))
    engine.add_request("left", "four five six", SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort_request("left")
    while engine.has_unfinished_requests():
        engine.step()
    flush_traces()
    trace = viz.load_trace(str(tmp_path))
    assert {r.request_id: r.finish_reason for r in trace.requests.values()} == {"kept": "length", "left": "abort"}
    ax = viz.plot_request_timeline(trace).axes[0]
    (crosses,) = [line for line in ax.lines if line.get_marker() == "X"]
    assert list(crosses.get_xdata()) == [trace.requests["left"].finished]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["#0", "#1  (aborted)"]
