"""docs/images/make_images.py draws the README's pictures from the committed trace of one run, so that
running it again rewrites no tracked PNG unless the drawing code changed."""

from __future__ import annotations

import importlib.util
import os

import viz

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "images", "make_images.py")


def _make_images():
    spec = importlib.util.spec_from_file_location("make_images", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pictures_are_drawn_from_the_committed_trace_byte_for_byte_alike(tmp_path):
    make_images = _make_images()
    assert os.path.exists(make_images.TRACE), "the committed trace is missing: run make_images.py --record"
    first, second = tmp_path / "first", tmp_path / "second"
    for out_dir in (first, second):
        out_dir.mkdir()
        make_images.draw(make_images.TRACE, str(out_dir))
    names = sorted(os.listdir(first))
    assert names == sorted([*make_images.PICTURES, "replay_step.png"])
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), f"{name} differs between two draws"
        assert b"Matplotlib version" not in (first / name).read_bytes()  # an upgrade alone changes nothing


def test_committed_trace_is_the_documented_run(tmp_path):
    """Four long requests that preempt each other, then two sharing a prompt prefix (a cache hit)."""
    import gzip

    make_images = _make_images()
    with gzip.open(make_images.TRACE, "rb") as f:
        (tmp_path / "tracevllm-docs.jsonl").write_bytes(f.read())
    trace = viz.load_trace(str(tmp_path))
    requests = list(trace.requests.values())
    assert len(requests) == 6 and trace.steps[0].num_gpu_blocks == 16
    assert any(s.preempted_req_ids for s in trace.steps)
    assert any(s.prefix_hits for s in trace.steps)
