"""Where a vLLM run's trace goes, and what its start-up says of the run.

The trace directory is ``TRACEVLLM_TRACE_DIR``: vLLM builds the scheduler itself, from a class name,
so an environment variable is the one way in that works alike for ``LLM(...)`` and ``vllm serve``. It
is checked when the scheduler is built (vLLM's start-up): unset, or a directory that cannot be
written, stops the start-up with a ValueError saying so, never a failure mid-run.

The start-up span (``EngineCore init``) carries the configuration tracevllm's own start-up records
(``core/stages.py``: ``SCHEDULER_CONFIG_ATTRS``, the KV cache's blocks), read from vLLM's config, and
the engine that ran (``PhaseAttr.ENGINE``): ``traces whatif`` replays the run from it.

The recording's observers (``tracing/vllm_tracer.py``: tracevllm's engine tracer and the
``llm_request`` spans) run in a process of their own (``tracing/observer_process.py``, optimisation
``observer_process``): vLLM's engine core thread then only encodes each step's events. With the
optimisation off (``TRACEVLLM_DISABLE_OPTIMIZATIONS=observer_process``) they run in that thread, as
tracevllm's own engine runs its tracer.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import StartupPhase
from tracevllm.core.stages import SCHEDULER_CONFIG_ATTRS, Phase, PhaseAttr
from tracevllm.optimizations import OptimizationConfig
from tracevllm.tracing.observer_process import ObserverProcess
from tracevllm.tracing.vllm_tracer import VllmTracer

TRACE_DIR_ENV = "TRACEVLLM_TRACE_DIR"


def trace_directory() -> str:
    """``TRACEVLLM_TRACE_DIR``, made and checked writable (ValueError otherwise)."""
    directory = os.environ.get(TRACE_DIR_ENV)
    if not directory:
        raise ValueError(f"tracevllm.vllm.TracingScheduler writes its trace to the directory in ${TRACE_DIR_ENV}, "
                         "and it is not set: set it, e.g. TRACEVLLM_TRACE_DIR=traces/vllm-run")
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise ValueError(f"${TRACE_DIR_ENV}={directory!r} cannot be written: {e}") from e
    return directory


@dataclass
class VllmRecording:
    """What the ``TracingScheduler`` records through: the engine core's recorder, whose one observer
    at the start is ``observers`` (``VllmTracer``, or ``ObserverProcess`` running one), which also
    hears the ``LlmRequestMessage``s from the scheduler."""

    recorder: EventRecorder
    observers: VllmTracer | ObserverProcess

    @staticmethod
    def start(vllm_config, num_gpu_blocks: int, block_size: int) -> VllmRecording:
        """Open the trace and record the start-up: vLLM's configuration, as tracevllm records its own."""
        import vllm

        trace_dir, model = trace_directory(), vllm_config.model_config.model
        if OptimizationConfig.from_names().enabled("observer_process"):
            observers = ObserverProcess.start(trace_dir, model)
        else:
            observers = VllmTracer(trace_dir, model)
        recorder = EventRecorder([observers])
        scheduler = vllm_config.scheduler_config
        # vLLM's SchedulerConfig has the same fields, but max_model_len is the model's.
        attributes = {attr: getattr(scheduler, name) for attr, name in SCHEDULER_CONFIG_ATTRS.items()
                      if name != "max_model_len"}
        attributes.update({
            PhaseAttr.MAX_MODEL_LEN: vllm_config.model_config.max_model_len,
            PhaseAttr.SCHEDULER_RESERVE_FULL_ISL: bool(scheduler.scheduler_reserve_full_isl),
            PhaseAttr.LONG_PREFILL_TOKEN_THRESHOLD: scheduler.long_prefill_token_threshold or 0,
            PhaseAttr.ENGINE: f"vLLM {vllm.__version__}", PhaseAttr.MODEL: model,
            PhaseAttr.NUM_GPU_BLOCKS: num_gpu_blocks, PhaseAttr.BLOCK_SIZE: block_size,
            PhaseAttr.ENABLE_PREFIX_CACHING: bool(vllm_config.cache_config.enable_prefix_caching),
        })
        now = time.time()  # vLLM's start-up is not ours to time: the span marks when the scheduler was built
        recorder.record(StartupPhase(Phase.ENGINE_CORE_INIT, now, now, attributes))
        return VllmRecording(recorder, observers)
