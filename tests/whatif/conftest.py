"""One offline run of the tiny Llama checkpoint, recorded once per session for the what-if tests: in a
single ``generate``, with chunked prefill (a token budget of 32), two prompts that share their first
blocks, a request with two samples, and a KV cache of 16 blocks of 4 tokens (17 with the null block),
too small for the requests together, so that the scheduler preempts."""

from __future__ import annotations

import pytest

from tracevllm import LLM, SamplingParams

ENGINE = dict(dtype="float32", block_size=4, num_gpu_blocks_override=17, max_model_len=64, max_num_seqs=8,
              max_num_batched_tokens=32)
SHARED = "A shared system prompt: answer briefly and politely."
PROMPTS = [f"Request number {i} asks the model for a fairly long answer, please." for i in range(4)]
PROMPTS += [SHARED + " Q1?", SHARED + " Q2?"]
PARAMS = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * 4 + [
    SamplingParams(temperature=0, max_tokens=10),
    SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=6, ignore_eos=True)]


@pytest.fixture(scope="session")
def recorded_run(tiny_checkpoint, tmp_path_factory) -> str:
    trace_dir = str(tmp_path_factory.mktemp("whatif_recorded"))
    llm = LLM(tiny_checkpoint("llama"), trace_out=trace_dir, **ENGINE)
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return trace_dir
