"""Optimisation "cuda_graphs" (tracevllm/worker/cuda_graphs.py).

A CUDA graph needs a GPU; what does not is checked here: the batch sizes, which steps replay a
graph, and the persistent buffers a replay reads, padding rows included. For that, ``EagerGraphs``
stands in for the capture: its "replay" runs the model again on the same buffers and views, which is
what a CUDA graph replays. The real capture runs on a GPU (``pytest tests/e2e`` there compares
graphs on and off with transformers).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tracevllm import LLM, SamplingParams
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.worker.cuda_graphs import CudaGraphs, cuda_graph_sizes


class EagerGraphs(CudaGraphs):
    """``CudaGraphs`` whose graphs are the captured call itself, run again on every replay; counts
    the replays of each size and the padding rows they ran."""

    def capture(self) -> list[int]:
        self.replays: dict[int, int] = {size: 0 for size in self.sizes}
        for size in self.sizes:
            def replay(size=size):
                self.replays[size] += 1
                self.outputs[size] = self._forward(size)

            self.graphs[size] = SimpleNamespace(replay=replay)
        return self.sizes


def test_sizes_are_vllms_buckets_up_to_max_num_seqs():
    assert cuda_graph_sizes(1) == [1]
    assert cuda_graph_sizes(3) == [1, 2, 4]
    assert cuda_graph_sizes(6) == [1, 2, 4, 8]
    assert cuda_graph_sizes(17) == [1, 2, 4, 8, 16, 24]
    assert cuda_graph_sizes(256)[-3:] == [240, 248, 256]


def test_enforce_eager_turns_the_graphs_off():
    assert EngineArgs().create_engine_config().optimization_config.enabled("cuda_graphs")
    assert not EngineArgs(enforce_eager=True).create_engine_config().optimization_config.enabled("cuda_graphs")


def _runner(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.model_executor.worker.model_runner


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama")


def _generate(llm: LLM):
    """Six requests of different lengths, finishing one after another: decode batches of 6, 5, ..., 1
    rows, so that most replays pad (6 and 5 run in the graph of 8, 3 in that of 4)."""
    prompts = [{"prompt_token_ids": [(7 * i + j) % 200 + 1 for j in range(5 + 3 * i)]} for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(6)]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the engine captures real graphs (the test below)")
def test_padded_replays_give_the_eager_tokens_and_write_no_other_slot(checkpoint):
    """Triton attention (interpreted here), float32: the same greedy tokens through the graphs'
    buffers as eagerly, every decode step replayed, and the padding rows' slots never written (the
    KV cache ends with the same slots written as the eager run's, the same values within rounding)."""
    options = dict(model=checkpoint, dtype="float32", attention_backend="triton", max_num_seqs=6,
                   max_num_batched_tokens=512)
    eager = LLM(**options)
    want = _generate(eager)
    eager_cache = [k.clone() for k, _ in _runner(eager).kv_caches]
    eager.llm_engine.shutdown()

    llm = LLM(**options)
    runner = _runner(llm)
    assert runner.capture_model() == [] and runner.model_forward is runner.model  # on a CPU: nothing to capture
    graphs = EagerGraphs(runner.model, runner.attn_metadata_builder, 6, runner.max_model_len,
                         runner.input_batch.block_table.max_num_blocks_per_req, runner.device)
    runner.model_forward = graphs
    assert graphs.capture() == [1, 2, 4, 8]
    assert _generate(llm) == want
    assert graphs.replays[8] >= 6 and graphs.replays[4] >= 3 and graphs.replays[1] >= 3
    for (k, _), k_eager in zip(runner.kv_caches, eager_cache):
        assert ((k != 0) == (k_eager != 0)).all()  # the same slots written, no other
        assert (k - k_eager).abs().max() < 1e-5  # a padded batch's GEMMs may round differently
    llm.llm_engine.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_captured_graphs_give_the_eager_tokens_on_cuda(checkpoint):
    """On CUDA the engine captures the graphs at start-up (sizes 1-8 for 6 sequences) and replays
    them for every decode step: the same greedy tokens as with ``enforce_eager``."""
    options = dict(model=checkpoint, dtype="float32", attention_backend="triton", max_num_seqs=6,
                   max_num_batched_tokens=512, device="cuda", kv_cache_memory_bytes=1 << 28)
    eager = LLM(**options, enforce_eager=True)
    assert _runner(eager).model_forward is _runner(eager).model
    want = _generate(eager)
    eager.llm_engine.shutdown()

    llm = LLM(**options)
    graphs = _runner(llm).model_forward
    assert isinstance(graphs, CudaGraphs) and sorted(graphs.graphs) == [1, 2, 4, 8]
    replays = {size: 0 for size in graphs.graphs}
    for size, graph in list(graphs.graphs.items()):
        def replay(size=size, graph=graph):
            replays[size] += 1
            graph.replay()

        graphs.graphs[size] = SimpleNamespace(replay=replay)
    assert _generate(llm) == want
    assert replays[8] >= 6 and replays[4] >= 3 and replays[1] >= 3
    llm.llm_engine.shutdown()
