"""The engine core's names for its own time: the stages of a step and the phases of its start-up.

``EngineCore`` times both through its ``EventRecorder`` (``core/event_recorder.py``) and records them under
these names: a ``StepRecord``'s ``durations`` are keyed by ``Stage``, a ``StartupPhase`` is named by
``Phase`` and carries what the phase learned, keyed by ``PhaseAttr``. The core owns these names; the
tracing schema (``tracing/schema.py``) names its spans and attributes after them, so that a span is
named after the stage it measures while the core imports nothing from tracing. Plain constants: this
module imports nothing.
"""


class Stage:
    """The stages of ``EngineCore.step()``, in the order they run (``STEP_STAGES``)."""

    SCHEDULE = "schedule"
    EXECUTE_MODEL = "execute_model"
    SAMPLE = "sample"
    UPDATE_FROM_OUTPUT = "update_from_output"


STEP_STAGES = (Stage.SCHEDULE, Stage.EXECUTE_MODEL, Stage.SAMPLE, Stage.UPDATE_FROM_OUTPUT)


class Phase:
    """The engine core's start-up as a whole, and its phases (vLLM 0.32 names them the same)."""

    ENGINE_CORE_INIT = "EngineCore init"
    LOAD_MODEL = "Load model"
    ALLOCATE_KV_CACHE = "Allocate KV cache"
    WARMUP = "Warmup"
    CAPTURE_CUDA_GRAPHS = "Capture CUDA graphs"  # on CUDA only (worker/cuda_graphs.py)


# The phases inside ENGINE_CORE_INIT, in the order they run.
ENGINE_CORE_PHASES = (Phase.LOAD_MODEL, Phase.ALLOCATE_KV_CACHE, Phase.WARMUP, Phase.CAPTURE_CUDA_GRAPHS)


class PhaseAttr:
    """What the start-up phases learn (``StartupPhase.attributes``)."""

    MODEL = "model"
    CPU_THREADS = "cpu.threads"  # torch threads per rank on CPU (worker/cpu_threads.py)
    ATTENTION_BACKEND = "attention.backend"  # "cpu (decode: ..., prefill: ...)" (attention/backends/cpu_attn.py)
    NUM_GPU_BLOCKS = "kv_cache.num_gpu_blocks"
    BLOCK_SIZE = "kv_cache.block_size"
    KV_CACHE_BYTES = "kv_cache.bytes"
    NUM_WARMUP_TOKENS = "warmup.num_tokens"
    # The server on CPU fits its token budget to a measured step (core/sched/token_budget.py).
    STEP_SECONDS_PER_TOKEN = "warmup.step_seconds_per_token"
    MAX_NUM_BATCHED_TOKENS = "scheduler.max_num_batched_tokens"
    # The decode batch sizes captured as CUDA graphs ("1,2,4,8"; "" when none: worker/cuda_graphs.py).
    CUDA_GRAPH_SIZES = "cuda_graphs.sizes"
    # The scheduler's limits, on the whole start-up (``traces check`` holds each step to them).
    MAX_NUM_SEQS = "scheduler.max_num_seqs"
    SCHEDULING_POLICY = "scheduler.policy"
