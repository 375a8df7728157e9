"""Draw docs/parallelism.md's two pictures: ``.venv/bin/python docs/images/make_parallel_images.py``.

- ``parallel_rank_slices.png``: which rank holds which slice of the bundled SmolLM2-135M at
  tensor_parallel_size=3 x pipeline_parallel_size=2 (``rank_slices``, from the model's config).
- ``parallel_workers.png``: the workers' timeline of a real run with pipeline_parallel_size=2 on the
  bundled model (8 prompts of 150-250 tokens prefilled in 64-token chunks, 16 output tokens each), read
  back from its trace. A new run has new timings: rerun this only to change that picture.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    from transformers import AutoConfig

    from tracevllm import LLM, SamplingParams
    from tracevllm.models.loader import resolve_model
    from viz.trace_loader import load_trace
    from viz.plots import plot_pipeline
    from rank_slices import plot_rank_slices

    config = AutoConfig.from_pretrained(resolve_model(None))
    plot_rank_slices(config, tp=3, pp=2, model_name="SmolLM2-135M").savefig(
        os.path.join(HERE, "parallel_rank_slices.png"), dpi=100)

    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(1000, 40000) for _ in range(rng.randint(150, 250))]}
               for _ in range(8)]
    with tempfile.TemporaryDirectory() as trace_dir:
        llm = LLM(pipeline_parallel_size=2, max_num_seqs=8, max_num_batched_tokens=64, trace_out=trace_dir)
        llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
        llm.llm_engine.shutdown()
        plot_pipeline(load_trace(trace_dir)).savefig(os.path.join(HERE, "parallel_workers.png"), dpi=100)


if __name__ == "__main__":
    main()
