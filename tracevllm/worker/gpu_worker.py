"""Worker: owns one device, its model runner and its KV cache (one per tensor-parallel rank)."""

from __future__ import annotations

import torch

from tracevllm.config import VllmConfig
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.worker.gpu_model_runner import GPUModelRunner
from tracevllm.worker.outputs import ModelRunnerOutput, SamplerOutput

_CPU_KV_CACHE_BYTES = 1 << 30  # default KV budget on CPU: 1 GiB
_FREE_GPU_MEMORY_SHARE = 0.9  # default on CUDA: this share of the memory free after loading


def gpu_kv_cache_budget(total: int, free: int, used_by_engine: int, gpu_memory_utilization: float) -> int:
    """KV-cache bytes on a GPU, as vLLM sizes them: this engine may use ``gpu_memory_utilization``
    of the GPU's ``total`` memory, and the KV cache gets what the loaded model (``used_by_engine``:
    what torch holds in this process now) leaves of that share.

    ValueError when the share is already taken: by other processes (less is ``free`` than the
    share still to be allocated) or by the model itself.
    """
    requested = int(total * gpu_memory_utilization)
    budget = requested - used_by_engine
    if budget > free:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} asks for {requested / 2**30:.2f} GiB of the GPU's "
            f"{total / 2**30:.2f} GiB, but only {(free + used_by_engine) / 2**30:.2f} GiB are free to this engine "
            "(other processes use the rest): lower gpu_memory_utilization or free the GPU."
        )
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} ({requested / 2**30:.2f} GiB) leaves nothing for "
            f"the KV cache: this process already holds {used_by_engine / 2**30:.2f} GiB (the model, and any other "
            "engine in it). Raise gpu_memory_utilization."
        )
    return budget


class Worker:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_runner = GPUModelRunner(vllm_config)

    def load_model(self) -> None:
        torch.manual_seed(self.vllm_config.model_config.seed)
        self.model_runner.load_model()

    def kv_cache_bytes_per_block(self) -> int:
        block_size = self.vllm_config.cache_config.block_size
        elem = torch.empty(0, dtype=self.vllm_config.model_config.dtype).element_size()
        return sum(2 * block_size * kvh * hd * elem for kvh, hd in self.model_runner.kv_cache_spec())

    def determine_num_available_blocks(self) -> int:
        """Blocks that fit the KV budget (or exactly ``num_gpu_blocks`` when the user set it). The
        budget: ``kv_cache_memory_bytes`` if set, else 1 GiB on CPU, else ``gpu_kv_cache_budget`` if
        ``gpu_memory_utilization`` is set, else 90 % of the GPU memory free after loading."""
        cache_config = self.vllm_config.cache_config
        if cache_config.num_gpu_blocks_override is not None:
            return cache_config.num_gpu_blocks_override
        budget = cache_config.kv_cache_memory_bytes
        if budget is None:
            device = self.vllm_config.device
            if device.type == "cuda":
                free, total = torch.cuda.mem_get_info(device)
                if cache_config.gpu_memory_utilization is None:
                    budget = int(free * _FREE_GPU_MEMORY_SHARE)
                else:
                    budget = gpu_kv_cache_budget(
                        total, free, torch.cuda.memory_reserved(device), cache_config.gpu_memory_utilization
                    )
            else:
                budget = _CPU_KV_CACHE_BYTES
        return budget // self.kv_cache_bytes_per_block()

    def initialize_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_kv_cache(num_blocks)

    def compile_or_warm_up_model(self) -> int:
        """Run the model once before serving (vLLM's name; there is nothing to compile here).
        Returns the number of tokens the warm-up ran."""
        return self.model_runner.warm_up()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, model_runner_output: ModelRunnerOutput) -> SamplerOutput:
        return self.model_runner.sample_tokens(model_runner_output)
