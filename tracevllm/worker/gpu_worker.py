"""Worker: owns one device, its model runner and its KV cache (one per tensor-parallel rank)."""

from __future__ import annotations

import dataclasses
import time

import torch

from tracevllm.config import VllmConfig
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import EngineIdle, OneTimeCost, WorkerStepRecord
from tracevllm.distributed.parallel_state import (
    COMM_CLOCK, get_pp_group, get_tp_group, init_distributed_environment, initialize_model_parallel,
)
from tracevllm.tracing import make_worker_observers
from tracevllm.worker import one_time_costs
from tracevllm.worker.cpu_malloc import keep_freed_memory
from tracevllm.worker.cpu_thread_follower import CpuThreadFollower
from tracevllm.worker.cpu_threads import choose_cpu_threads, usable_cores
from tracevllm.worker.gpu_model_runner import GPUModelRunner
from tracevllm.model_runner_output import ModelRunnerOutput, SamplerOutput

_CPU_KV_CACHE_BYTES = 1 << 30  # default KV budget on CPU: 1 GiB
_FREE_GPU_MEMORY_SHARE = 0.9  # default on CUDA: this share of the memory free after loading
# The warm-up's prompt: a prefill batch large enough to run each kernel a prefill runs (on CUDA it
# compiles torch.compile's chains and the Triton attention's prefill tiles), in start-up, not in a request.
WARMUP_TOKENS = 128


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
    """One rank. An executor starts one per rank (``world_size`` of them, each in its own process when
    there are several), then sends every one the same calls in the same order: ``load_model``,
    ``determine_num_available_blocks`` (take the minimum over the ranks), ``initialize_cache``,
    ``compile_or_warm_up_model``, then per step ``execute_model`` and ``sample_tokens``. The ranks
    compute the same logits (the LM head gathers them) and, seeded alike, sample the same tokens, so
    each keeps its own copy of every sequence in step; rank 0's outputs are the ones to return. With
    pipeline stages, only the last stage samples (its tensor-parallel rank 0 answers, the executor's
    ``output_rank``); the earlier stages send their intermediate tensors on and learn the sampled
    tokens from the next ``SchedulerOutput``.

    With world size > 1 the constructor joins the world (``distributed_init_method``, the same
    ``tcp://host:port`` on every rank) and creates the TP and PP groups, which blocks until every rank
    has done so; on CUDA the rank runs on ``cuda:<local_rank>``, whatever device the config names.
    """

    def __init__(self, vllm_config: VllmConfig, rank: int = 0, local_rank: int = 0,
                 distributed_init_method: str | None = None) -> None:
        parallel_config = vllm_config.parallel_config
        # On CPU the ranks share this machine's cores: each gets its share, or fewer threads where
        # fewer ran faster (worker/cpu_threads.py).
        self.cpu_threads = None if vllm_config.device.type != "cpu" else choose_cpu_threads(
            vllm_config.cpu_threads, max(1, usable_cores() // parallel_config.world_size))
        # ... and, unless the count was set, measures again when another process takes a core or gives
        # it back (worker/cpu_thread_follower.py).
        self.thread_follower = None
        if (self.cpu_threads is not None and vllm_config.cpu_threads is None
                and vllm_config.optimization_config.enabled("cpu_thread_follower")):
            self.thread_follower = CpuThreadFollower.for_rank(
                self.cpu_threads.num_threads, self.cpu_threads.cores, parallel_config.world_size)
        if parallel_config.world_size > 1:
            if distributed_init_method is None:
                raise ValueError(f"Worker: world size {parallel_config.world_size} needs a distributed_init_method "
                                 "(tcp://host:port, the same on every rank).")
            cuda = vllm_config.device.type == "cuda"
            if cuda:
                vllm_config = dataclasses.replace(vllm_config, device=torch.device("cuda", local_rank))
            init_distributed_environment(parallel_config.world_size, rank, distributed_init_method, local_rank,
                                         backend="nccl" if cuda else "gloo")
            initialize_model_parallel(parallel_config.tensor_parallel_size, parallel_config.pipeline_parallel_size)
        if vllm_config.device.type == "cpu" and vllm_config.optimization_config.enabled("keep_freed_memory"):
            keep_freed_memory()
        self.vllm_config = vllm_config
        self.rank = rank
        self.model_runner = GPUModelRunner(vllm_config)
        self._model_output: ModelRunnerOutput | None = None
        # With several ranks, each records its share of every step for its own observers (its
        # tracer exports them from this process); with one, the engine core's step says it all.
        observers = make_worker_observers(vllm_config.observability_config) if parallel_config.world_size > 1 else []
        self.recorder = EventRecorder(observers)

    def get_cpu_threads(self) -> int | None:
        """The torch threads this rank chose at start-up on a CPU (None on CUDA)."""
        return None if self.cpu_threads is None else self.cpu_threads.num_threads

    def get_attention_backend(self) -> str:
        """The attention backend this rank runs, and what it chose at start-up ("cpu (decode: ..., prefill: ...)")."""
        return self.model_runner.attention_backend

    def take_one_time_costs(self) -> list[OneTimeCost]:
        """What this process built or loaded once since the last call (worker/one_time_costs.py)."""
        return one_time_costs.take()

    def load_model(self) -> None:
        torch.manual_seed(self.vllm_config.model_config.seed)
        self.model_runner.load_model()

    def kv_cache_bytes_per_block(self) -> int:
        block_size = self.vllm_config.cache_config.block_size
        elem = torch.empty(0, dtype=self.vllm_config.model_config.dtype).element_size()
        return sum(2 * block_size * kvh * hd * elem for kvh, hd in self.model_runner.kv_cache_spec())

    def determine_num_available_blocks(self) -> int:
        """Blocks that fit this rank's KV budget (or exactly ``num_gpu_blocks_override``, when set).
        The budget, per rank: ``kv_cache_memory_bytes`` if set, else 1 GiB on CPU, else
        ``gpu_kv_cache_budget`` if ``gpu_memory_utilization`` is set, else 90 % of the GPU memory free
        after loading. A block holds only this rank's KV heads; the executor takes the minimum over
        the ranks, whose free memory may differ."""
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
        """Run the model once before the first request, on ``WARMUP_TOKENS`` tokens, so that no request
        pays a one-time cost: allocations and kernel choices; on CUDA the compilation of the
        element-wise chains (optimisation "compiled_norm_act") and of the Triton attention kernel's
        prefill tiles, which took the first request about a second. (On CPU nothing is compiled: the
        chains are C++ ops built once per machine.) Returns the tokens run."""
        return self.model_runner.warm_up(WARMUP_TOKENS)

    def capture_model(self) -> list[int]:
        """On CUDA, capture the decode CUDA graphs, after the warm-up (vLLM's order too)."""
        return self.model_runner.capture_model()

    def run_dummy_step(self, num_tokens: int, num_reqs: int = 1) -> int:
        """The warm-up's dummy step again, ``num_reqs`` prompts of ``num_tokens`` tokens: a step to time."""
        return self.model_runner.warm_up(num_tokens, num_reqs)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run the forward pass. The logits stay here, for ``sample_tokens``; the output returned
        (possibly to another process) has none."""
        probe = None if self.thread_follower is None else self.thread_follower.check()
        if not self.recorder.enabled:
            self._model_output = self.model_runner.execute_model(scheduler_output)
            return dataclasses.replace(self._model_output, logits=None, one_time_costs=one_time_costs.take(),
                                       cpu_threads_probe=probe)
        clock = COMM_CLOCK
        recv_s, send_s, collective_s, start = clock.recv_s, clock.send_s, clock.collective_s, time.time()
        self._model_output = self.model_runner.execute_model(scheduler_output)
        recv_s, send_s = clock.recv_s - recv_s, clock.send_s - send_s
        self.recorder.record(WorkerStepRecord(
            self.rank, get_tp_group().rank_in_group, get_pp_group().rank_in_group, start, time.time(),
            scheduler_output.total_num_scheduled_tokens, recv_s, send_s,
            recv_s + send_s + clock.collective_s - collective_s, scheduler_output.step_context,
        ))
        return dataclasses.replace(self._model_output, logits=None, one_time_costs=one_time_costs.take(),
                                   cpu_threads_probe=probe)

    def record_engine_idle(self) -> None:
        """The engine core has no request left (``EngineCore._record_if_idle``): this rank's observers
        hear it too (its tracer completes its trace file)."""
        if self.recorder.enabled:
            self.recorder.record(EngineIdle(time.time()))

    def sample_tokens(self) -> SamplerOutput:
        """Sample from the logits of the last ``execute_model``."""
        model_output, self._model_output = self._model_output, None
        return self.model_runner.sample_tokens(model_output)
