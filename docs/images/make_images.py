"""Redraw the pictures in this directory: ``.venv/bin/python docs/images/make_images.py``.

The run is the viz tests' (tests/viz/conftest.py): the tiny random-weight Llama of the tests, 16 KV
blocks of 4 tokens, four long requests that preempt each other, then two that share a prompt prefix.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import viz  # noqa: E402
from tests.tiny_checkpoints import make_tiny_checkpoint  # noqa: E402
from tests.viz.conftest import ENGINE, LONG_PROMPTS, SHARED_PROMPTS  # noqa: E402
from tracevllm import LLM, SamplingParams  # noqa: E402
from tracevllm.models.loader import resolve_model  # noqa: E402

PICTURES = {
    "request_timeline.png": viz.plot_request_timeline,
    "kv_block_map.png": viz.plot_kv_block_map,
    "step_composition.png": viz.plot_step_composition,
    "engine_gauges.png": viz.plot_engine_gauges,
}


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = make_tiny_checkpoint("llama", os.path.join(scratch, "llama"), resolve_model(None))
        trace_dir = os.path.join(scratch, "traces")
        llm = LLM(checkpoint, trace_out=trace_dir, **ENGINE)
        llm.generate(LONG_PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
        llm.generate(SHARED_PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        trace = viz.load_trace(trace_dir)
        for name, plot in PICTURES.items():
            plot(trace).savefig(os.path.join(here, name))
        steps = [s.number for s in trace.steps]
        viz.replay.render_step(trace, steps[len(steps) // 3]).savefig(os.path.join(here, "replay_step.png"))
    print(f"wrote {len(PICTURES) + 1} pictures to {here}")


if __name__ == "__main__":
    main()
