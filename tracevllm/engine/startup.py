"""The engine core's start-up: everything built once, before the first step, from a ``VllmConfig``.

    EngineCore.from_config(vllm_config)
      start_up(vllm_config)             each phase a start-up span of the trace (core/stages.py: Phase)
        Load model                      the executor: its workers and their weights
        Allocate KV cache               as many blocks as the memory holds (block 0: the null block)
        Warm-up                         a dummy step, so that no request pays a one-time cost; then
                                        the token budget fitted to ``target_step_seconds``
        Capture CUDA graphs             on a GPU: one graph per decode batch size
        Profile steps                   in a step-level trace: the step timed at a ladder of shapes
        the scheduler                   over the KV cache's blocks, with the budget as fitted
      EngineCore(scheduler, model_executor, recorder)

``EngineCore``'s constructor builds nothing: it takes these three. The what-if and the parity check
build their own three (a scheduler over a simulated executor, on a simulated clock) and hand them to
the same constructor.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import tracevllm
from tracevllm.config import VllmConfig
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.sched.async_scheduler import AsyncScheduler
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.core.sched.token_budget import PROBE_TOKENS, fit_token_budget, seconds_per_token
from tracevllm.core.stages import SCHEDULER_CONFIG_ATTRS, Phase, PhaseAttr
from tracevllm.engine.step_profile import ladder_profile, profile_attributes, profile_steps
from tracevllm.executor.abstract import Executor
from tracevllm.step_cost import BatchFeatures, StepCostModel
from tracevllm.tracing import make_engine_observers

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineCoreParts:
    """What the start-up builds: what ``EngineCore`` steps."""

    scheduler: Scheduler
    model_executor: Executor
    recorder: EventRecorder


def start_up(vllm_config: VllmConfig, startup_trace_headers: dict[str, str] | None = None) -> EngineCoreParts:
    """Build the engine core's parts. ``startup_trace_headers``: the front end's start-up span, handed
    to the core's observers (the tracer makes it the parent of this core's start-up trace)."""
    # Everything the core records goes here; observers (tracing) listen, when there are any.
    recorder = EventRecorder(make_engine_observers(vllm_config.observability_config, startup_trace_headers))
    model_name = vllm_config.model_config.model
    with recorder.phase(Phase.ENGINE_CORE_INIT) as startup:
        start = time.perf_counter()
        logger.info("Loading the model's weights (%s) on %s...", model_name, vllm_config.device)
        with recorder.phase(Phase.LOAD_MODEL, {PhaseAttr.MODEL: model_name}) as attributes:
            executor = Executor.get_class(vllm_config)(vllm_config)
            attributes[PhaseAttr.ATTENTION_BACKEND] = executor.get_attention_backend()
            if vllm_config.device.type == "cpu":
                attributes[PhaseAttr.CPU_THREADS] = executor.get_cpu_threads()
        logger.info("Model loaded in %.1f s", time.perf_counter() - start)
        with recorder.phase(Phase.ALLOCATE_KV_CACHE) as attributes:
            num_gpu_blocks = _initialize_kv_caches(vllm_config, executor)
            attributes.update({
                PhaseAttr.NUM_GPU_BLOCKS: num_gpu_blocks,
                PhaseAttr.BLOCK_SIZE: vllm_config.cache_config.block_size,
                PhaseAttr.ENABLE_PREFIX_CACHING: vllm_config.cache_config.enable_prefix_caching,
                PhaseAttr.KV_CACHE_BYTES: num_gpu_blocks * executor.kv_cache_bytes_per_block(),
            })
        start = time.perf_counter()
        logger.info("Warming up: one dummy step, so that the first request pays no one-time costs...")
        with recorder.phase(Phase.WARMUP) as attributes:
            attributes[PhaseAttr.NUM_WARMUP_TOKENS] = executor.compile_or_warm_up_model()
            logger.info("Warm-up done in %.1f s (%d tokens)", time.perf_counter() - start,
                        attributes[PhaseAttr.NUM_WARMUP_TOKENS])
            if vllm_config.scheduler_config.target_step_seconds is not None:
                attributes.update(_fit_token_budget(vllm_config, executor))
        if vllm_config.device.type == "cuda":
            with recorder.phase(Phase.CAPTURE_CUDA_GRAPHS) as attributes:
                start = time.perf_counter()
                sizes = executor.capture_model()
                attributes[PhaseAttr.CUDA_GRAPH_SIZES] = ",".join(map(str, sizes))
                if sizes:
                    logger.info("Captured %d CUDA graphs (decode batches of %d-%d) in %.1f s", len(sizes),
                                sizes[0], sizes[-1], time.perf_counter() - start)
        observability = vllm_config.observability_config
        if observability.tracing_enabled and observability.trace_level == "step":
            with recorder.phase(Phase.PROFILE_STEPS) as attributes:
                attributes.update(_profile_steps(vllm_config, executor))
        # What the start-up built or loaded once (the C++ ops): the trace shows each in its phase.
        for cost in executor.take_one_time_costs():
            recorder.record(cost)
        scheduler_cls = AsyncScheduler if vllm_config.scheduler_config.async_scheduling else Scheduler
        scheduler = scheduler_cls(vllm_config.scheduler_config, vllm_config.cache_config, recorder,
                                  use_pp=vllm_config.parallel_config.pipeline_parallel_size > 1)
        # The scheduler as built (its budget as fitted): what a what-if replays the run from.
        scheduler_config = vllm_config.scheduler_config
        startup.update({attr: getattr(scheduler_config, name) for attr, name in SCHEDULER_CONFIG_ATTRS.items()})
        startup[PhaseAttr.ENGINE] = f"tracevllm {tracevllm.__version__}"
    return EngineCoreParts(scheduler, executor, recorder)


def _initialize_kv_caches(vllm_config: VllmConfig, executor: Executor) -> int:
    """Give the workers as many KV blocks as their memory holds; ValueError if one request of
    ``max_model_len`` tokens would not fit."""
    cache_config = vllm_config.cache_config
    num_blocks = executor.determine_num_available_blocks()
    max_model_len = vllm_config.model_config.max_model_len
    usable = num_blocks - 1  # block 0 is the null block (core/block_pool.py): it holds no request's KV
    if usable * cache_config.block_size < max_model_len:
        raise ValueError(
            f"The KV cache holds {num_blocks} blocks of {cache_config.block_size} tokens, {usable} of them for "
            f"requests (block 0 is the null block): {usable * cache_config.block_size} tokens, fewer than "
            f"max_model_len ({max_model_len}): lower max_model_len or give the KV cache more blocks or memory."
        )
    executor.initialize_cache(num_blocks)
    cache_config.num_gpu_blocks = num_blocks
    return num_blocks


def _fit_token_budget(vllm_config: VllmConfig, executor: Executor) -> dict[str, float]:
    """Lower ``max_num_batched_tokens`` to what this machine runs in ``target_step_seconds`` a step
    (core/sched/token_budget.py), before the scheduler is built; the attributes for the span."""
    config = vllm_config.scheduler_config
    model = StepCostModel.from_profile(profile_steps(executor.run_dummy_step, PROBE_TOKENS))
    ceiling = config.max_num_batched_tokens
    config.max_num_batched_tokens = fit_token_budget(model, config.target_step_seconds, config.max_num_seqs, ceiling)
    (small, large), chunk = PROBE_TOKENS, BatchFeatures.prompt_chunk
    logger.info("Token budget: max_num_batched_tokens=%d (a %d-token prompt chunk takes %.1f ms here, a %d-token one "
                "%.1f ms; target %.1f s a step, so that streams do not stall; default ceiling %d; "
                "--max-num-batched-tokens sets it)", config.max_num_batched_tokens, small,
                model.predict(chunk(small)) * 1e3, large, model.predict(chunk(large)) * 1e3,
                config.target_step_seconds, ceiling)
    if (seconds := model.predict(chunk(config.max_num_seqs))) > 2 * config.target_step_seconds:
        logger.warning("A step of max_num_seqs=%d tokens takes about %.1f s here: lower --max-num-seqs for "
                       "shorter gaps between a stream's chunks.", config.max_num_seqs, seconds)
    return {PhaseAttr.STEP_SECONDS_PER_TOKEN: seconds_per_token(model),
            PhaseAttr.MAX_NUM_BATCHED_TOKENS: config.max_num_batched_tokens}


def _profile_steps(vllm_config: VllmConfig, executor: Executor) -> dict[str, list[int] | list[float]]:
    """Time the step at a ladder of shapes (engine/step_profile.py), for a what-if on this trace;
    the attributes for the span."""
    config, start = vllm_config.scheduler_config, time.perf_counter()
    profile = ladder_profile(executor.run_dummy_step, config.max_num_batched_tokens, config.max_num_seqs)
    logger.info("Profiled the step at %d shapes in %.1f s, for the what-if (traces whatif)",
                len(profile.prefill) + len(profile.decode), time.perf_counter() - start)
    return profile_attributes(profile)
