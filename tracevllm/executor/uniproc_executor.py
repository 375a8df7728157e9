"""UniProcExecutor: runs the one Worker in the engine core's own process (tensor parallel size 1).

The executor is the seam where tensor parallelism plugs in: a multi-process executor will send the
same calls to one worker per rank and return rank 0's results.
"""

from __future__ import annotations

from tracevllm.config import VllmConfig
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.worker.gpu_worker import Worker
from tracevllm.worker.outputs import ModelRunnerOutput, SamplerOutput


class UniProcExecutor:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.worker = Worker(vllm_config)
        self.worker.load_model()

    def determine_num_available_blocks(self) -> int:
        return self.worker.determine_num_available_blocks()

    def kv_cache_bytes_per_block(self) -> int:
        return self.worker.kv_cache_bytes_per_block()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def compile_or_warm_up_model(self) -> int:
        return self.worker.compile_or_warm_up_model()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def sample_tokens(self, model_runner_output: ModelRunnerOutput) -> SamplerOutput:
        return self.worker.sample_tokens(model_runner_output)
