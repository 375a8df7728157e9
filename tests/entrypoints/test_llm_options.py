"""vLLM's common LLM(...) arguments: gpu_memory_utilization, enforce_eager, tensor_parallel_size."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from tracevllm import LLM, SamplingParams
from tracevllm.config import CacheConfig
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.worker.gpu_worker import Worker

GiB = 2**30


@pytest.mark.slow
def test_vllm_arguments_are_accepted(bundled_model_dir):
    llm = LLM(dtype="float32", max_model_len=256, gpu_memory_utilization=0.5, enforce_eager=True,
              tensor_parallel_size=1, num_gpu_blocks_override=32)
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


@pytest.mark.parametrize("options, match", [
    (dict(tensor_parallel_size=2), r"tensor_parallel_size \(2\) must divide the model's number of attention heads"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization must be in"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization must be in"),
    (dict(gpu_memory_utilization=float("nan")), "gpu_memory_utilization must be in"),
])
def test_values_that_cannot_be_honoured_are_value_errors(bundled_model_dir, options, match):
    with pytest.raises(ValueError, match=match):
        LLM(**options)


def test_they_are_cli_flags_too():
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--gpu-memory-utilization", "0.7", "--enforce-eager", "-tp", "1"]))
    assert (args.gpu_memory_utilization, args.enforce_eager, args.tensor_parallel_size) == (0.7, True, 1)
    assert not args.create_engine_config().optimization_config.enabled("cuda_graphs")  # enforce_eager: no graphs


def fake_cuda_worker(monkeypatch, total, free, reserved, **cache) -> Worker:
    """A Worker on a pretend CUDA device, with the memory figures given (bytes) and 1 MiB blocks."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    worker = Worker.__new__(Worker)
    worker.vllm_config = SimpleNamespace(device=torch.device("cuda"), cache_config=CacheConfig(**cache))
    monkeypatch.setattr(worker, "kv_cache_bytes_per_block", lambda: 2**20)
    return worker


def test_gpu_memory_utilization_sizes_the_kv_cache(monkeypatch):
    # 80 GiB GPU, model 2 GiB: 0.5 -> 40 GiB for the engine, 38 GiB of KV cache = 38 * 1024 blocks.
    worker = fake_cuda_worker(monkeypatch, 80 * GiB, 78 * GiB, 2 * GiB, gpu_memory_utilization=0.5)
    assert worker.determine_num_available_blocks() == 38 * 1024
    # Not given: 90 % of the free memory (so a second engine in the process still finds some).
    default = fake_cuda_worker(monkeypatch, 80 * GiB, 10 * GiB, 2 * GiB)
    assert default.determine_num_available_blocks() == int(10 * GiB * 0.9) // 2**20
    # kv_cache_memory_bytes and num_gpu_blocks_override take precedence, as in vLLM.
    assert fake_cuda_worker(monkeypatch, 80 * GiB, 78 * GiB, 2 * GiB, gpu_memory_utilization=0.5,
                            kv_cache_memory_bytes=GiB).determine_num_available_blocks() == 1024
    assert fake_cuda_worker(monkeypatch, 80 * GiB, 78 * GiB, 2 * GiB, gpu_memory_utilization=0.5,
                            num_gpu_blocks_override=7).determine_num_available_blocks() == 7
    with pytest.raises(ValueError, match="other processes"):
        fake_cuda_worker(monkeypatch, 80 * GiB, 10 * GiB, 2 * GiB,
                         gpu_memory_utilization=0.9).determine_num_available_blocks()


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_memory_utilization_on_cuda(bundled_model_dir):
    llm = LLM(gpu_memory_utilization=0.3, max_model_len=256)
    _, total = torch.cuda.mem_get_info()
    blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    assert blocks > 0
    # The whole engine (weights + KV cache) stays within the share, give or take the warm-up's activations.
    assert torch.cuda.memory_reserved() <= 0.3 * total + GiB
    del llm
