"""Redraw the viz pictures in this directory: ``.venv/bin/python docs/images/make_images.py [--record]``.

The run is the viz tests' (tests/viz/conftest.py): the tiny random-weight Llama of the tests, 16 KV
blocks of 4 tokens, four long requests that preempt each other, then two that share a prompt prefix.

The pictures are drawn from that run's trace as committed here (``tiny_run.jsonl.gz``, 18 KB), not
from a new run. A run's timings differ every time, so drawing from a new run rewrote every PNG (the
timeline's and the gauges' time axes, the step durations) even when nothing in viz had changed, and
the diff of a change to viz was buried under that noise. From the fixed trace a rerun writes the same
bytes, and a picture changes only when the code that draws it does. ``--record`` runs the engine
again and replaces the trace first: for when the engine's schedule or the trace's schema changed.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import viz  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "tiny_run.jsonl.gz")
PICTURES = {
    "request_timeline.png": viz.plot_request_timeline,
    "kv_block_map.png": viz.plot_kv_block_map,
    "step_composition.png": viz.plot_step_composition,
    "engine_gauges.png": viz.plot_engine_gauges,
}
PNG_METADATA = {"Software": None}  # no matplotlib version in the file: an upgrade alone changes no byte


def record(path: str) -> None:
    """Run the tests' tiny model on the viz tests' requests and save the trace, gzipped (with no
    timestamp in the gzip header, so the same trace gives the same bytes)."""
    from tests.tiny_checkpoints import make_tiny_checkpoint
    from tests.viz.conftest import ENGINE, LONG_PROMPTS, SHARED_PROMPTS
    from tracevllm import LLM, SamplingParams
    from tracevllm.models.loader import resolve_model

    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = make_tiny_checkpoint("llama", os.path.join(scratch, "llama"), resolve_model(None))
        trace_dir = os.path.join(scratch, "traces")
        llm = LLM(checkpoint, trace_out=trace_dir, **ENGINE)
        llm.generate(LONG_PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
        llm.generate(SHARED_PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0) as out:
            for name in sorted(glob.glob(os.path.join(trace_dir, "tracevllm-*.jsonl"))):
                with open(name, "rb") as f:
                    out.write(f.read())


def draw(path: str, out_dir: str = HERE) -> None:
    """The pictures of the gzipped trace at ``path``, as PNGs in ``out_dir``."""
    with tempfile.TemporaryDirectory() as trace_dir:
        with gzip.open(path, "rb") as f, open(os.path.join(trace_dir, "tracevllm-docs.jsonl"), "wb") as out:
            out.write(f.read())
        trace = viz.load_trace(trace_dir)
        for name, plot in PICTURES.items():
            plot(trace).savefig(os.path.join(out_dir, name), metadata=PNG_METADATA)
        steps = [s.number for s in trace.steps]
        viz.animation.render_step(trace, steps[len(steps) // 3]).savefig(
            os.path.join(out_dir, "replay_step.png"), metadata=PNG_METADATA)
    print(f"drew {len(PICTURES) + 1} pictures in {out_dir} from {os.path.basename(path)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help=f"run the engine again and replace {TRACE}")
    if parser.parse_args().record or not os.path.exists(TRACE):
        record(TRACE)
    draw(TRACE)


if __name__ == "__main__":
    main()
