"""Executor: how the engine core reaches its workers, one per rank, whatever runs them.

Everything the engine core asks of the workers is one ``collective_rpc(method, args)``: the same
call on every rank, in the same order. The subclasses differ only in where the ranks live::

    UniProcExecutor          one Worker in the engine core's own process (world size 1)
    MultiprocExecutor        one worker process per rank on this machine
    RayDistributedExecutor   one Ray actor per rank, on one machine or several

Only one rank's answer matters for a step: the output rank (tensor-parallel rank 0 of the last
pipeline stage) samples, and its ``ModelRunnerOutput`` / ``SamplerOutput`` are the step's. The
other ranks compute their slice and learn the sampled tokens from the next ``SchedulerOutput``.

With ``non_block=True`` a call returns a ``Future`` at once; the engine core keeps up to
``max_concurrent_batches`` (the number of pipeline stages, or two when it schedules asynchronously)
steps in flight that way (``EngineCore.step_with_batch_queue``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any

from tracevllm.config import VllmConfig
from tracevllm.core.events import OneTimeCost
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.model_runner_output import ModelRunnerOutput, SamplerOutput


class Executor(ABC):
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        parallel = vllm_config.parallel_config
        self.world_size = parallel.world_size
        # Ranks are pp_rank * tp + tp_rank: the last stage's tensor-parallel rank 0.
        self.output_rank = (parallel.pipeline_parallel_size - 1) * parallel.tensor_parallel_size
        self._init_executor()

    @staticmethod
    def get_class(vllm_config: VllmConfig) -> type["Executor"]:
        backend = vllm_config.parallel_config.distributed_executor_backend
        if backend == "mp":
            from tracevllm.executor.multiproc_executor import MultiprocExecutor

            return MultiprocExecutor
        if backend == "ray":
            from tracevllm.executor.ray_distributed_executor import RayDistributedExecutor

            return RayDistributedExecutor
        from tracevllm.executor.uniproc_executor import UniProcExecutor

        return UniProcExecutor

    @abstractmethod
    def _init_executor(self) -> None:
        """Start the workers, and load the model in each."""

    @abstractmethod
    def collective_rpc(
        self, method: str, args: tuple = (), unique_reply_rank: int | None = None, non_block: bool = False
    ) -> Any:
        """Call ``Worker.<method>(*args)`` on every rank. Returns the list of their results in rank
        order, or only ``unique_reply_rank``'s result; with ``non_block``, a Future of that.
        Raises ``RuntimeError`` (with the worker's traceback) if a worker fails or dies."""

    def shutdown(self) -> None:
        """Stop the workers (nothing to do when they live in this process)."""

    @property
    def max_concurrent_batches(self) -> int:
        return self.vllm_config.max_concurrent_batches

    # ---- set-up --------------------------------------------------------------------------------

    def determine_num_available_blocks(self) -> int:
        """Every rank holds the same block ids, so the cache is as large as the smallest rank's."""
        return min(self.collective_rpc("determine_num_available_blocks"))

    def kv_cache_bytes_per_block(self) -> int:
        """One block's bytes over all ranks (each holds its own layers' and heads' share)."""
        return sum(self.collective_rpc("kv_cache_bytes_per_block"))

    def initialize_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_cache", (num_blocks,))

    def compile_or_warm_up_model(self) -> int:
        return self.collective_rpc("compile_or_warm_up_model", unique_reply_rank=self.output_rank)

    def capture_model(self) -> list[int]:
        """Capture the decode CUDA graphs on every rank (worker/cuda_graphs.py); the sizes captured."""
        return self.collective_rpc("capture_model", unique_reply_rank=self.output_rank)

    def get_cpu_threads(self) -> int | None:
        """The torch threads of the output rank on a CPU (worker/cpu_threads.py); None on CUDA."""
        return self.collective_rpc("get_cpu_threads", unique_reply_rank=self.output_rank)

    def get_attention_backend(self) -> str:
        """The output rank's attention backend and the ops it chose (attention/backends/cpu_attn.py)."""
        return self.collective_rpc("get_attention_backend", unique_reply_rank=self.output_rank)

    def take_one_time_costs(self) -> list[OneTimeCost]:
        """What the output rank built or loaded once since the last call (worker/one_time_costs.py)."""
        return self.collective_rpc("take_one_time_costs", unique_reply_rank=self.output_rank)

    def run_dummy_step(self, num_tokens: int, num_reqs: int = 1) -> int:
        """One step of ``num_reqs`` dummy ``num_tokens``-token prompts on every rank (fewer where the
        limits or the KV cache do not allow as many); returns the tokens it ran, all prompts together."""
        return self.collective_rpc("run_dummy_step", (num_tokens, num_reqs), unique_reply_rank=self.output_rank)

    # ---- one step ------------------------------------------------------------------------------

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        return self.collective_rpc("execute_model", (scheduler_output,), self.output_rank, non_block)

    def sample_tokens(self, non_block: bool = False) -> SamplerOutput | Future[SamplerOutput]:
        """Sample from the logits of the last ``execute_model`` (each worker keeps them)."""
        return self.collective_rpc("sample_tokens", (), self.output_rank, non_block)
