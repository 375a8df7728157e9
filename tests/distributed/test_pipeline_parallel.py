"""Pipeline parallelism: the layer split, each stage's model and weights, and whole engines.

The model tests build every stage of a model in this process (the PP group is faked: building a
stage needs only its rank in the group) and chain the stages by hand: stage 0's IntermediateTensors
into stage 1 must give the whole model's logits. The engine tests run ``LLM(...,
distributed_executor_backend="mp")`` with pp=2 and tp=2 x pp=2 on CPU (gloo): greedy tokens (and a
seeded sample, logprobs and prompt logprobs) equal a single-process engine's, with chunked prefill, a
prefix-cache hit and preemptions; two batches are in flight at once, and no worker outlives the
engine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracevllm import LLM, SamplingParams
from tracevllm.attention.backends.abstract import AttentionMetadata
from tracevllm.attention.backends.torch_attn import TorchAttentionBackend
from tracevllm.attention.layer import Attention, bind_kv_cache
from tracevllm.distributed import parallel_state
from tracevllm.distributed.parallel_state import GroupCoordinator
from tracevllm.distributed.utils import get_pp_indices
from tracevllm.models.loader import load_model
from tracevllm.models.utils import IntermediateTensors, PPMissingLayer

CPU = torch.device("cpu")


@pytest.mark.parametrize("num_layers, pp, sizes", [
    (4, 2, [2, 2]), (5, 2, [3, 2]), (5, 3, [2, 2, 1]), (22, 4, [5, 6, 6, 5]), (7, 4, [2, 2, 2, 1]), (3, 3, [1, 1, 1]),
])
def test_get_pp_indices_spreads_the_remainder_before_the_last_stage(num_layers, pp, sizes):
    ranges = [get_pp_indices(num_layers, rank, pp) for rank in range(pp)]
    assert [end - start for start, end in ranges] == sizes
    assert [start for start, _ in ranges] == [0] + [end for _, end in ranges[:-1]] and ranges[-1][1] == num_layers


# ---- every stage's model, in this process ---------------------------------------------------------


def stage_model(monkeypatch, path: str, pp_rank: int, pp_size: int):
    with monkeypatch.context() as m:
        m.setattr(parallel_state, "_PP", GroupCoordinator(tuple(range(pp_size)), pp_rank))
        return load_model(path, torch.float32, CPU, TorchAttentionBackend)


def prefill(model, num_tokens: int, intermediate_tensors=None):
    """One sequence's prefill of tokens ``100 ..``, in a fresh paged KV cache of this model's layers."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    bind_kv_cache(model, [(torch.zeros(8, 4, layer.num_kv_heads, layer.head_dim),
                           torch.zeros(8, 4, layer.num_kv_heads, layer.head_dim)) for layer in layers])
    query_start_loc, seq_lens = np.array([0, num_tokens], dtype=np.int32), np.array([num_tokens], dtype=np.int32)
    metadata = AttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=num_tokens, max_seq_len=num_tokens,
        query_start_loc=torch.from_numpy(query_start_loc), seq_lens=torch.from_numpy(seq_lens),
        block_table=torch.arange(8, dtype=torch.int32).view(1, 8), slot_mapping=torch.arange(num_tokens),
        query_start_loc_cpu=query_start_loc, seq_lens_cpu=seq_lens,
    )
    with torch.inference_mode():
        return model(torch.arange(100, 100 + num_tokens), torch.arange(num_tokens), metadata, intermediate_tensors)


@pytest.mark.parametrize("arch, overrides, layers_per_stage", [
    ("llama", {"num_hidden_layers": 3}, [[0, 1], [2]]),  # tied: the last stage's LM head loads the embedding
    ("qwen3", {"num_hidden_layers": 4}, [[0], [1, 2], [3]]),  # a middle stage: no embedding, norm or head
], ids=["llama-tied-2-stages", "qwen3-3-stages"])
def test_stages_chained_give_the_whole_model(monkeypatch, tiny_checkpoint, arch, overrides, layers_per_stage):
    path = tiny_checkpoint(arch, **overrides)
    whole = load_model(path, torch.float32, CPU, TorchAttentionBackend)
    expected = whole.compute_logits(prefill(whole, 7))
    pp = len(layers_per_stage)
    intermediate = None
    for rank, layers in enumerate(layers_per_stage):
        model = stage_model(monkeypatch, path, rank, pp)
        first, last = rank == 0, rank == pp - 1
        params = dict(model.named_parameters())
        assert {int(n.split(".")[2]) for n in params if n.startswith("model.layers.")} == set(layers)
        assert ("model.embed_tokens.weight" in params) == first
        assert ("lm_head.weight" in params) == (last and not first)  # tied at pp=1: one tensor, the embedding's
        assert ("model.norm.weight" in params) == last
        assert sum(isinstance(m, PPMissingLayer) for m in model.modules()) == (
            len(whole.model.layers) - len(layers) + (not first) + 2 * (not last))
        assert len([m for m in model.modules() if isinstance(m, Attention)]) == len(layers)  # the KV cache's layers
        out = prefill(model, 7, intermediate)
        if last:
            torch.testing.assert_close(model.compute_logits(out), expected, atol=0, rtol=0)
        else:
            assert isinstance(out, IntermediateTensors) and out.hidden_states.shape == out.residual.shape == (7, 64)
            intermediate = out
    if arch == "llama":
        torch.testing.assert_close(model.lm_head.weight, whole.model.embed_tokens.weight, atol=0, rtol=0)


def test_a_stage_still_refuses_an_unexpected_weight(monkeypatch, tiny_checkpoint):
    """Weights of another stage's layers are skipped; a name no stage has is still an error."""
    model = stage_model(monkeypatch, tiny_checkpoint("qwen2"), 1, 2)
    assert model.is_other_stage_weight("model.layers.0.self_attn.q_proj.weight")
    assert model.is_other_stage_weight("model.embed_tokens.weight")
    assert not model.is_other_stage_weight("model.layers.1.self_attn.q_proj.weight")
    with pytest.raises(ValueError, match="does not expect: 'model.layers.5.mlp.up_proj.weight'"):
        model.load_weights([("model.layers.5.mlp.up_proj.weight", torch.zeros(128, 64))])
    with pytest.raises(ValueError, match=r"missing weights: \['lm_head.weight'"):
        model.load_weights([])


# ---- whole engines, one process per rank -------------------------------------------------------------

# A 4-token block size, 16-token steps and 14 blocks (15 with the null block): the 13-21-token prompts
# prefill in chunks, two of them share their first 12 tokens (a prefix-cache hit), and the four do not
# fit together as they grow, so some are preempted and recomputed.
OPTIONS = dict(dtype="float32", block_size=4, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=56,
               num_gpu_blocks_override=15, enable_prefix_caching=True)
SHARED = list(range(1000, 1012))
PROMPTS = [{"prompt_token_ids": SHARED + [7, 8, 9, 10, 11, 12, 13, 14, 15]},
           {"prompt_token_ids": [300 + 11 * i for i in range(13)]},
           {"prompt_token_ids": SHARED + [21, 22, 23, 24]},
           {"prompt_token_ids": [900 + 3 * i for i in range(17)]}]
PARAMS = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2, prompt_logprobs=2),
          SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
          SamplingParams(temperature=1.0, seed=7, max_tokens=18, ignore_eos=True)]


def results(outputs) -> list:
    """Per request: its tokens, then the token ids and logprobs of each sampled and prompt position."""
    def logprobs(entries):
        return [(sorted(e), [e[t].logprob for t in sorted(e)]) if e else None for e in entries or []]

    return [(o.outputs[0].token_ids, logprobs(o.outputs[0].logprobs), logprobs(o.prompt_logprobs)) for o in outputs]


def assert_same_results(got: list, expected: list) -> None:
    """Tokens and logprob token ids exactly; logprobs to float32 rounding (tp sums in another order)."""
    for (tokens, *logprobs), (want_tokens, *want_logprobs) in zip(got, expected, strict=True):
        assert tokens == want_tokens
        for positions, want_positions in zip(logprobs, want_logprobs, strict=True):
            assert [p and p[0] for p in positions] == [p and p[0] for p in want_positions]
            values = [x for p in positions if p for x in p[1]]
            assert values == pytest.approx([x for p in want_positions if p for x in p[1]], abs=1e-4)


def run_pipeline(path: str, trace_dir: str, **parallel) -> None:
    """The four prompts, twice, against a single-process engine, counting preemptions and batches
    in flight (seen as each batch is sent, behind those already in the queue). The run is traced into
    ``trace_dir``, which the suite holds to the engine's invariants (tests/conftest.py): batches in
    flight, preemptions and prefix hits together."""
    reference = LLM(path, **OPTIONS)
    expected = [results(reference.generate(PROMPTS, PARAMS, use_tqdm=False)) for _ in range(2)]
    reference.llm_engine.shutdown()

    llm = LLM(path, distributed_executor_backend="mp", trace_out=trace_dir, **parallel, **OPTIONS)
    core = llm.llm_engine.engine_core.engine_core
    seen = {"preempted": 0, "in_flight": 0, "overlapped": 0}
    execute_model, preempt = core.model_executor.execute_model, core.scheduler._preempt

    def spy_execute_model(scheduler_output, non_block=False):
        in_flight = len(core.batch_queue) + 1  # this batch, behind those not back yet
        seen["in_flight"] = max(seen["in_flight"], in_flight)
        # The older batch is still running in the workers while the newer one is sent behind it.
        seen["overlapped"] += in_flight == 2 and not core.batch_queue[0][1].done()
        return execute_model(scheduler_output, non_block)

    def spy_preempt(request, *args):
        seen["preempted"] += 1
        preempt(request, *args)

    core.model_executor.execute_model, core.scheduler._preempt = spy_execute_model, spy_preempt
    procs = core.model_executor.procs
    try:
        outputs = [llm.generate(PROMPTS, PARAMS, use_tqdm=False) for _ in range(2)]
        for got, want in zip(outputs, expected):
            assert_same_results(results(got), want)
        assert outputs[0][2].num_cached_tokens == 12
        assert seen["preempted"] > 0
        assert seen["in_flight"] == 2 and seen["overlapped"] > 0
        assert len(procs) == parallel.get("tensor_parallel_size", 1) * parallel["pipeline_parallel_size"]
    finally:
        llm.llm_engine.shutdown()
    assert not any(p.is_alive() for p in procs)


def test_pp2_equals_one_process(tiny_checkpoint, tmp_path):
    """Tiny Llama (tied embeddings): one layer per stage."""
    run_pipeline(tiny_checkpoint("llama"), str(tmp_path), pipeline_parallel_size=2)


def test_tp2_pp2_equals_one_process(tiny_checkpoint, tmp_path):
    """Tiny Qwen2 (q/k/v biases, sharded checkpoint) with 3 layers: stage 0 runs two, stage 1 one;
    each stage's two ranks split every layer's heads."""
    run_pipeline(tiny_checkpoint("qwen2", num_hidden_layers=3), str(tmp_path), tensor_parallel_size=2,
                 pipeline_parallel_size=2)
