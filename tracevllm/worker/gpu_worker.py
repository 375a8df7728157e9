"""Worker: owns one device, its model runner and its KV cache (one per tensor-parallel rank)."""

from __future__ import annotations

import torch

from tracevllm.config import VllmConfig
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.worker.gpu_model_runner import GPUModelRunner
from tracevllm.worker.outputs import ModelRunnerOutput, SamplerOutput

_CPU_KV_CACHE_BYTES = 1 << 30  # default KV budget on CPU: 1 GiB
_GPU_MEMORY_UTILIZATION = 0.9  # default share of free GPU memory for the KV cache


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
        """Blocks that fit the KV budget (or exactly ``num_gpu_blocks`` when the user set it)."""
        cache_config = self.vllm_config.cache_config
        if cache_config.num_gpu_blocks_override is not None:
            return cache_config.num_gpu_blocks_override
        budget = cache_config.kv_cache_memory_bytes
        if budget is None:
            device = self.vllm_config.device
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                budget = int(free * _GPU_MEMORY_UTILIZATION)
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
