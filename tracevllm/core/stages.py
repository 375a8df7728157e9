"""The engine core's names for its own time: the stages of a step and the phases of its start-up.

``EngineCore`` times both through its ``EventRecorder`` (``core/event_recorder.py``) and records them under
these names: a ``StepRecord``'s ``durations`` are keyed by ``Stage``, its ``parts`` (the model
runner's host path inside two stages) by ``StepPart``; a ``StartupPhase`` is named by ``Phase`` and
carries what the phase learned, keyed by ``PhaseAttr``. The core owns these names; the tracing schema
(``tracing/schema.py``) names its spans and attributes after them, so that a span is named after the
stage it measures while the core imports nothing from tracing. Plain constants: this
module imports nothing.
"""


class Stage:
    """The stages of ``EngineCore.step()``, in the order they run (``STEP_STAGES``)."""

    SCHEDULE = "schedule"
    EXECUTE_MODEL = "execute_model"
    SAMPLE = "sample"
    UPDATE_FROM_OUTPUT = "update_from_output"


STEP_STAGES = (Stage.SCHEDULE, Stage.EXECUTE_MODEL, Stage.SAMPLE, Stage.UPDATE_FROM_OUTPUT)


class StepPart:
    """The host path inside two stages, as the model runner laps it (``worker/gpu_model_runner.py``).
    On CUDA the forward and the logits only launch kernels: their device time is measured apart
    (``StepRecord.forward_device_s``), and the wait for it falls in ``DEVICE_SYNC``."""

    UPDATE_STATES = "update_states"  # the scheduler's diff applied to the persistent batch
    PREPARE_INPUTS = "prepare_inputs"  # the host arrays: positions, token ids, slots, query starts
    COPY_INPUTS = "copy_inputs"  # those arrays to the device, and the attention backend's metadata
    FORWARD = "forward"  # the model's forward pass (on CUDA: launching it)
    COMPUTE_LOGITS = "compute_logits"  # the LM head at the sampling rows (and prompt logprobs)
    SAMPLER = "sampler"  # the Sampler, from logits to token ids (on CUDA: launching it)
    DEVICE_SYNC = "device_sync"  # the step's one device-to-host copy (it waits for the device), and the logprobs'
    APPEND_TOKENS = "append_tokens"  # the sampled tokens appended to the runner's rows


# The parts of each stage, in the order they run. A stage's parts add up to no more than the stage:
# what is left is the executor's (with the mp executor, the messages to and from the worker).
STEP_PARTS = {
    Stage.EXECUTE_MODEL: (StepPart.UPDATE_STATES, StepPart.PREPARE_INPUTS, StepPart.COPY_INPUTS,
                          StepPart.FORWARD, StepPart.COMPUTE_LOGITS),
    Stage.SAMPLE: (StepPart.SAMPLER, StepPart.DEVICE_SYNC, StepPart.APPEND_TOKENS),
}


class Phase:
    """The engine core's start-up as a whole, and its phases (vLLM 0.32 names them the same)."""

    ENGINE_CORE_INIT = "EngineCore init"
    LOAD_MODEL = "Load model"
    ALLOCATE_KV_CACHE = "Allocate KV cache"
    WARMUP = "Warmup"
    CAPTURE_CUDA_GRAPHS = "Capture CUDA graphs"  # on CUDA only (worker/cuda_graphs.py)
    PROFILE_STEPS = "Profile steps"  # when the steps are traced: for the what-if (engine/step_profile.py)


# The phases inside ENGINE_CORE_INIT, in the order they run.
ENGINE_CORE_PHASES = (Phase.LOAD_MODEL, Phase.ALLOCATE_KV_CACHE, Phase.WARMUP, Phase.CAPTURE_CUDA_GRAPHS,
                      Phase.PROFILE_STEPS)


class PhaseAttr:
    """What the start-up phases learn (``StartupPhase.attributes``)."""

    ENGINE = "engine"  # which engine ran: "tracevllm 0.1.0", or "vLLM 0.32.0" (recorded by tracevllm/vllm/)
    MODEL = "model"
    CPU_THREADS = "cpu.threads"  # torch threads per rank on CPU (worker/cpu_threads.py)
    ATTENTION_BACKEND = "attention.backend"  # "cpu (decode: ..., prefill: ...)" (attention/backends/cpu_attn.py)
    NUM_GPU_BLOCKS = "kv_cache.num_gpu_blocks"
    BLOCK_SIZE = "kv_cache.block_size"
    KV_CACHE_BYTES = "kv_cache.bytes"
    NUM_WARMUP_TOKENS = "warmup.num_tokens"
    # The server on CPU fits its token budget to a measured step (core/sched/token_budget.py); the
    # budget is on the whole start-up too, as fitted or given.
    STEP_SECONDS_PER_TOKEN = "warmup.step_seconds_per_token"
    MAX_NUM_BATCHED_TOKENS = "scheduler.max_num_batched_tokens"
    # The decode batch sizes captured as CUDA graphs ("1,2,4,8"; "" when none: worker/cuda_graphs.py).
    CUDA_GRAPH_SIZES = "cuda_graphs.sizes"
    # The step timed at a ladder of shapes (engine/step_profile.py): one prompt chunk of each number of
    # tokens, and one batch of each number of one-token (decode) rows, the fastest seconds of each.
    PROFILE_PREFILL_TOKENS = "profile.prefill_tokens"
    PROFILE_PREFILL_SECONDS = "profile.prefill_seconds"
    PROFILE_DECODE_ROWS = "profile.decode_rows"
    PROFILE_DECODE_SECONDS = "profile.decode_seconds"
    # The scheduler's configuration, on the whole start-up: ``traces check`` holds each step to its
    # limits, and ``traces whatif`` replays the run from it (with the KV cache's, on its phase).
    MAX_NUM_SEQS = "scheduler.max_num_seqs"
    SCHEDULING_POLICY = "scheduler.policy"
    MAX_MODEL_LEN = "scheduler.max_model_len"
    ENABLE_CHUNKED_PREFILL = "scheduler.enable_chunked_prefill"
    LONG_PREFILL_TOKEN_THRESHOLD = "scheduler.long_prefill_token_threshold"
    SCHEDULER_RESERVE_FULL_ISL = "scheduler.reserve_full_isl"
    WATERMARK = "scheduler.watermark"
    ASYNC_SCHEDULING = "scheduler.async_scheduling"
    ENABLE_PREFIX_CACHING = "kv_cache.enable_prefix_caching"


# What the whole start-up records of the scheduler's configuration: each attribute's ``SchedulerConfig`` field.
SCHEDULER_CONFIG_ATTRS = {
    PhaseAttr.MAX_NUM_SEQS: "max_num_seqs", PhaseAttr.SCHEDULING_POLICY: "policy",
    PhaseAttr.MAX_NUM_BATCHED_TOKENS: "max_num_batched_tokens", PhaseAttr.MAX_MODEL_LEN: "max_model_len",
    PhaseAttr.ENABLE_CHUNKED_PREFILL: "enable_chunked_prefill",
    PhaseAttr.LONG_PREFILL_TOKEN_THRESHOLD: "long_prefill_token_threshold",
    PhaseAttr.SCHEDULER_RESERVE_FULL_ISL: "scheduler_reserve_full_isl", PhaseAttr.WATERMARK: "watermark",
    PhaseAttr.ASYNC_SCHEDULING: "async_scheduling",
}
