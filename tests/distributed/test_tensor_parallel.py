"""Tensor parallelism end to end at the worker level: tp Workers, one process per rank (CPU, gloo),
against one Worker on the same checkpoint.

Every rank gets the same SchedulerOutputs, made by a real Scheduler in this process (chunked prefill,
a prefix-cache hit, a preemption for want of blocks); rank 0's sampled tokens and logprobs must equal
the single Worker's, and every rank must sample the same tokens (each keeps its own copy of every
sequence). Plus the checks that refuse a tp the model cannot be split by, before any process starts.
"""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

from tests.rank_processes import RankProcesses
from tracevllm.config import ParallelConfig
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.request import Request
from tracevllm.sampling_params import SamplingParams
from tracevllm.worker.gpu_worker import Worker

NUM_BLOCKS = 12  # of 4 tokens (11 and the null block): too few for the three requests at once, so one is preempted
LOGPROBS = 5


@pytest.fixture(scope="module")
def tp2_ranks():
    ranks = RankProcesses(2)
    yield ranks
    ranks.close()


def engine_config(model: str, attention_backend: str = "auto", dtype: str = "float32"):
    # max_num_batched_tokens 16: the 21-token prompt is prefilled in chunks.
    return EngineArgs(model=model, dtype=dtype, device="cpu", attention_backend=attention_backend, block_size=4,
                      max_num_batched_tokens=16, max_num_seqs=8, max_model_len=32).create_engine_config()


def prompt(n: int, start: int = 0) -> list[int]:
    return [100 + (start + 37 * j) % 4000 for j in range(n)]


def start_ranks(ranks: RankProcesses, vllm_config, tp: int, reference: Worker) -> None:
    """The executor's start-up calls, on every rank. A rank's KV block holds its own KV heads:
    max(1, num_kv_heads / tp) of them, the same number on every rank."""
    ranks.build(dataclasses.replace(vllm_config, parallel_config=ParallelConfig(tensor_parallel_size=tp)))
    ranks.call("load_model")
    num_kv_heads = vllm_config.model_config.hf_config.num_key_value_heads
    expected_bytes = reference.kv_cache_bytes_per_block() * max(1, num_kv_heads // tp) // num_kv_heads
    assert ranks.call("kv_cache_bytes_per_block") == [expected_bytes] * tp
    assert len(set(ranks.call("determine_num_available_blocks"))) == 1
    ranks.call("initialize_cache", NUM_BLOCKS)
    ranks.call("compile_or_warm_up_model")


def run_both(ranks: RankProcesses, vllm_config, tp: int) -> None:
    """Drive a tp=1 Worker and the tp ranks through the same steps, comparing every sampling step."""
    reference = Worker(vllm_config)
    reference.load_model()
    reference.initialize_cache(NUM_BLOCKS)
    reference.compile_or_warm_up_model()
    start_ranks(ranks, vllm_config, tp, reference)

    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    scheduler = Scheduler(vllm_config.scheduler_config, vllm_config.cache_config)
    greedy = SamplingParams(temperature=0.0, max_tokens=5, logprobs=LOGPROBS, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=5, logprobs=LOGPROBS, ignore_eos=True)
    requests = {"long": Request("long", prompt(21), greedy, None, 0.0),
                "short": Request("short", prompt(7, start=1), seeded, None, 1.0),
                # Shares the long prompt's first 3 blocks, computed by the time it arrives.
                "prefix": Request("prefix", prompt(12) + prompt(6, start=2), greedy, None, 2.0)}
    scheduler.add_request(requests["long"])
    scheduler.add_request(requests["short"])
    step = num_sampled = 0
    while scheduler.has_unfinished_requests():
        if step == 3:
            scheduler.add_request(requests["prefix"])
        scheduler_output = scheduler.schedule()
        expected_output = reference.execute_model(scheduler_output)
        expected = reference.sample_tokens()
        for model_output, sampled in ranks.step(scheduler_output):
            assert model_output.sampling_req_ids == expected_output.sampling_req_ids
            assert sampled.sampled_token_ids.tolist() == expected.sampled_token_ids.tolist()
            if expected.logprobs_tensors is not None:
                got, want = sampled.logprobs_tensors, expected.logprobs_tensors
                assert torch.equal(got.logprob_token_ids, want.logprob_token_ids)
                torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-4, rtol=0)
        num_sampled += len(expected.sampled_token_ids)
        scheduler.update_from_output(scheduler_output, expected_output, expected)
        step += 1
    assert num_sampled >= 15  # 5 tokens for each request, more if one was preempted
    assert requests["prefix"].num_cached_tokens == 12
    assert sum(r.num_preemptions for r in requests.values()) > 0


@pytest.mark.parametrize("attention_backend", ["auto", "triton"])  # auto: cpu, or torch with optimisations off
@pytest.mark.parametrize("arch, overrides", [
    ("llama", {}),  # 4 query heads, 2 KV heads: one KV head per rank
    ("qwen2", {}),  # q/k/v biases
    ("qwen3", {"num_key_value_heads": 1}),  # the one KV head replicated on both ranks; q/k norms per head
], ids=["llama-4q2kv", "qwen2-4q2kv", "qwen3-4q1kv"])
def test_tp2_equals_one_worker(tp2_ranks, tiny_checkpoint, arch, overrides, attention_backend):
    if attention_backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the ranks run on the CPU, where triton needs TRITON_INTERPRET=1 (tests/conftest.py sets it "
                    "only when there is no GPU)")
    run_both(tp2_ranks, engine_config(tiny_checkpoint(arch, **overrides), attention_backend), tp=2)


def gemm_weights(worker: Worker) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    model = worker.model_runner.model
    layer = model.model.layers[0]
    modules = {"qkv_proj": layer.self_attn.qkv_proj, "o_proj": layer.self_attn.o_proj,
               "down_proj": layer.mlp.down_proj, "lm_head": model.lm_head}
    return {name: _gemm_weight(m) for name, m in modules.items()}


def _gemm_weight(module: torch.nn.Module) -> tuple[torch.dtype, tuple[int, ...]]:
    """The dtype and ``[out, in]`` shape of the weight ``module``'s GEMM runs on: with onednn_gemm, its
    copy packed for oneDNN; with cpu_vec_gemm (bf16 on AVX512-BF16 without AMX) or single_row_vec_gemm
    (beside oneDNN's, on AMX, where measured faster), its copy packed in groups of 64 outputs
    (``[G, in / 2, 64, 2]``)."""
    if getattr(module, "vec_packed_weight", None) is not None:
        packed = module.vec_packed_weight
        return packed.dtype, (module.vec_out_features, 2 * packed.shape[1])
    weight = module.weight if getattr(module, "packed_weight", None) is None else module.packed_weight
    return weight.dtype, tuple(weight.shape)


def test_tp2_bfloat16_keeps_float32_gemm_weights_per_shard(tp2_ranks, tiny_checkpoint):
    """bf16 on a CPU without bf16 GEMMs stores each rank's weight shards as float32 copies (with
    them, as bf16 shards packed for oneDNN, optimisation onednn_gemm, or for cpu_vec_gemm); the
    logprobs stay within bf16 rounding of one worker's (the partial sums are rounded before the
    all-reduce adds them, so bitwise equality is not expected)."""
    from tracevllm.layers.cpu_gemm import cpu_lacks_half_gemm

    vllm_config = engine_config(tiny_checkpoint("llama"), dtype="bfloat16")
    reference = Worker(vllm_config)
    reference.load_model()
    reference.initialize_cache(NUM_BLOCKS)
    start_ranks(tp2_ranks, vllm_config, 2, reference)
    gemm_dtype = torch.float32 if cpu_lacks_half_gemm(torch.bfloat16) else torch.bfloat16
    full = gemm_weights(reference)
    for shards in tp2_ranks.call(gemm_weights):
        assert {name: dtype for name, (dtype, _) in shards.items()} == dict.fromkeys(full, gemm_dtype)
        assert shards["qkv_proj"][1] == (full["qkv_proj"][1][0] // 2, 64)  # 2 of 4 q heads, 1 of 2 KV heads
        assert shards["o_proj"][1] == (64, full["o_proj"][1][1] // 2)
        assert shards["lm_head"][1] == (49152 // 2, 64)

    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    scheduler = Scheduler(vllm_config.scheduler_config, vllm_config.cache_config)
    top20 = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20)
    scheduler.add_request(Request("r", prompt(12), top20, None, 0.0))
    scheduler_output = scheduler.schedule()
    reference.execute_model(scheduler_output)
    expected = reference.sample_tokens().logprobs_tensors.logprobs
    (_, sampled), _ = tp2_ranks.step(scheduler_output)
    top = sampled.logprobs_tensors.logprobs
    torch.testing.assert_close(top[:, 1:], expected[:, 1:], atol=0.1, rtol=0)  # the top 20, best first


@pytest.mark.slow
def test_tp3_on_the_bundled_smollm2(bundled_model_dir):
    """SmolLM2-135M: 9 query heads and 3 KV heads, so each of 3 ranks holds 3 query heads and 1 KV head."""
    ranks = RankProcesses(3)
    try:
        run_both(ranks, engine_config(bundled_model_dir), tp=3)
    finally:
        ranks.close()


def test_worker_needs_the_init_method_for_more_than_one_rank(tiny_checkpoint):
    vllm_config = engine_config(tiny_checkpoint("llama"))
    with pytest.raises(ValueError, match="needs a distributed_init_method"):
        Worker(dataclasses.replace(vllm_config, parallel_config=ParallelConfig(tensor_parallel_size=2)))


def model_shape(heads=8, kv_heads=4, intermediate=128, layers=2):
    return SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
                           num_hidden_layers=layers)


@pytest.mark.parametrize("tp, pp, shape, match", [
    (3, 1, model_shape(), r"tensor_parallel_size \(3\) must divide the model's number of attention heads \(8\)"),
    (4, 1, model_shape(heads=12, kv_heads=6), r"must divide the model's number of KV heads \(6\)"),
    (8, 1, model_shape(heads=24, kv_heads=3), r"larger than the model's number of KV heads \(3\), so it must be"),
    (2, 1, model_shape(intermediate=99), r"must divide the model's intermediate_size \(99\)"),
    (1, 3, model_shape(), r"pipeline_parallel_size \(3\) must be <= the model's number of layers \(2\)"),
])
def test_a_split_the_model_does_not_allow_is_a_value_error(tp, pp, shape, match):
    with pytest.raises(ValueError, match=match):
        ParallelConfig(tp, pp).verify_with_model(shape)


@pytest.mark.parametrize("tp, kv_heads", [(1, 4), (2, 4), (4, 4), (8, 4), (8, 2), (8, 1)])
def test_splits_the_model_allows_pass(tp, kv_heads):
    ParallelConfig(tp).verify_with_model(model_shape(kv_heads=kv_heads))


def test_parallel_config_fields():
    assert ParallelConfig().distributed_executor_backend == "uni"
    assert ParallelConfig(2, 2).distributed_executor_backend == "mp" and ParallelConfig(2, 2).world_size == 4
    assert ParallelConfig(2, distributed_executor_backend="ray").distributed_executor_backend == "ray"
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1, got 0"):
        ParallelConfig(0)
    with pytest.raises(ValueError, match="distributed_executor_backend must be one of"):
        ParallelConfig(2, distributed_executor_backend="threads")
    with pytest.raises(ValueError, match="'uni' runs one process"):
        ParallelConfig(2, distributed_executor_backend="uni")


@pytest.mark.parametrize("options, match", [
    (dict(tensor_parallel_size=3), "must divide the model's number of attention heads"),  # checked first
    (dict(tensor_parallel_size=4, distributed_executor_backend="uni"), "'uni' runs one process"),
    (dict(pipeline_parallel_size=3), r"pipeline_parallel_size \(3\) must be <= the model's number of layers \(2\)"),
])
def test_engine_args_check_the_split_before_any_process_starts(tiny_checkpoint, options, match):
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=tiny_checkpoint("llama"), device="cpu", **options).create_engine_config()
