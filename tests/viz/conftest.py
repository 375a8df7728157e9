"""Real traces for the viz tests, recorded once per session with the tiny Llama checkpoint, together
with what the engine itself knew while it ran them (the truth the loader is checked against)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.outputs import RequestOutput

# 16 blocks of 4 tokens (17 with the null block) for 4 requests that each grow to ~40 tokens: preemption
# is certain. A token budget of 32 cuts the first prompts into chunks.
LONG_PROMPTS = [f"Request number {i} asks the model for a fairly long answer, please." for i in range(4)]
# Then two prompts sharing their first blocks, run together: the second hits the first's blocks.
SHARED = "A shared system prompt: answer briefly and politely."
SHARED_PROMPTS = [SHARED + " Q1?", SHARED + " Q2?"]
ENGINE = dict(dtype="float32", block_size=4, num_gpu_blocks_override=17, max_model_len=64, max_num_seqs=8,
              max_num_batched_tokens=32)


@dataclass
class Recording:
    """A trace directory and the engine's own view of the run.

    ``block_tables[i]`` is, after the ``update_from_output`` of engine step i + 1 (the step's last
    stage: its preemptions and its finished requests have dropped their blocks by then), every
    request's block table as ``KVCacheManager.get_block_ids`` gives it, for the requests holding any.
    That is exactly the state the trace's block changes of steps 1..i+1 replay to.
    """

    trace_dir: str
    outputs: list[RequestOutput]
    block_tables: list[dict[str, tuple[int, ...]]]
    preemptions: Counter


def _record(trace_dir: str, checkpoint: str) -> Recording:
    block_tables: list[dict[str, tuple[int, ...]]] = []
    preemptions: Counter = Counter()
    update_from_output, preempt = Scheduler.update_from_output, Scheduler._preempt

    def update_and_snapshot(self, *args, **kwargs):
        outputs = update_from_output(self, *args, **kwargs)
        manager = self.kv_cache_manager
        block_tables.append({r: tuple(manager.get_block_ids(r)) for r in self.requests if manager.get_block_ids(r)})
        return outputs

    def preempt_and_count(self, request, *args):
        preemptions[request.request_id] += 1
        return preempt(self, request, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Scheduler, "update_from_output", update_and_snapshot)
        patch.setattr(Scheduler, "_preempt", preempt_and_count)
        llm = LLM(checkpoint, trace_out=trace_dir, **ENGINE)
        outputs = llm.generate(LONG_PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                               use_tqdm=False)
        outputs += llm.generate(SHARED_PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                                use_tqdm=False)
    return Recording(trace_dir, outputs, block_tables, preemptions)


@pytest.fixture(scope="session")
def recording(tiny_checkpoint, tmp_path_factory) -> Recording:
    """A step-level trace with chunked prefill, preemptions and a shared prefix."""
    return _record(str(tmp_path_factory.mktemp("viz_traces")), tiny_checkpoint("llama"))


@pytest.fixture(scope="session")
def request_level_dir(tiny_checkpoint, tmp_path_factory) -> str:
    """A ``--trace-level request`` trace: requests only, no engine steps."""
    trace_dir = str(tmp_path_factory.mktemp("viz_request_level"))
    llm = LLM(tiny_checkpoint("llama"), trace_out=trace_dir, trace_level="request", **ENGINE)
    llm.generate(SHARED_PROMPTS, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    return trace_dir


@pytest.fixture(scope="session")
def multiprocess_dir(tiny_checkpoint, tmp_path_factory) -> str:
    """Two processes' files (``LLM(multiprocess=True)``: front end and engine core) for one request
    with two samples (n=2: two engine-core requests under one ``llm_request``)."""
    trace_dir = str(tmp_path_factory.mktemp("viz_multiprocess"))
    llm = LLM(tiny_checkpoint("llama"), trace_out=trace_dir, multiprocess=True, **ENGINE)
    try:
        llm.generate(SHARED_PROMPTS[0], SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=4, ignore_eos=True),
                     use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    return trace_dir
