"""The trace schema: every span, span event and attribute tracevllm writes, named once.

The observers in ``tracevllm/tracing/`` write these names, ``viz/`` reads them, and the tables of
``docs/tracing.md`` are generated from these names (``tracing/schema_doc.py``; a test keeps the
document equal to its output). The engine core's stages and start-up phases, and what the
phases learn, are the core's own names (``core/stages.py``): their spans and attributes take them from
there. Plain constants only: importing this module loads nothing else (``core/stages.py`` neither),
so ``viz`` reads a trace without torch or the engine.

Two services share one ``service.namespace``, so that Jaeger's service column tells the two halves
of the engine apart::

    tracevllm               the front end: HTTP, llm_request, tokenize, prefill/decode, detokenize
    tracevllm.engine_core   the engine core: scheduler.request, engine_step and its stages

Only ``llm_request`` carries ``gen_ai.*`` keys (OpenTelemetry's GenAI conventions, and vLLM's names
for the same span), so a GenAI-aware viewer marks exactly one span per request as the LLM call.
"""

from __future__ import annotations

from tracevllm.core import stages
from tracevllm.core.stages import Phase, PhaseAttr, Stage, StepPart


class Service:
    NAMESPACE = "tracevllm"
    FRONTEND = "tracevllm"
    ENGINE_CORE = "tracevllm.engine_core"
    WORKER = "tracevllm.worker"  # one process (or Ray actor) per rank, when there are several


class SpanName:
    # One trace per request.
    LLM_REQUEST = "llm_request"
    TOKENIZE = "tokenize"
    SCHEDULER_REQUEST = "scheduler.request"
    PREFILL = "prefill"
    DECODE = "decode"
    DETOKENIZE = "detokenize"
    # One trace per engine step, and its stages (the stages of EngineCore.step()).
    ENGINE_STEP = "engine_step"
    SCHEDULE = Stage.SCHEDULE
    EXECUTE_MODEL = Stage.EXECUTE_MODEL
    SAMPLE = Stage.SAMPLE
    UPDATE_FROM_OUTPUT = Stage.UPDATE_FROM_OUTPUT
    # The model runner's host path inside execute_model and sample (children of those stages).
    UPDATE_STATES = StepPart.UPDATE_STATES
    PREPARE_INPUTS = StepPart.PREPARE_INPUTS
    COPY_INPUTS = StepPart.COPY_INPUTS
    FORWARD = StepPart.FORWARD
    COMPUTE_LOGITS = StepPart.COMPUTE_LOGITS
    SAMPLER = StepPart.SAMPLER
    DEVICE_SYNC = StepPart.DEVICE_SYNC
    APPEND_TOKENS = StepPart.APPEND_TOKENS
    # A rank's share of a step (in the worker's own process), a child of engine_step.
    WORKER_EXECUTE_MODEL = "worker.execute_model"
    CPU_THREADS_PROBE = "cpu_threads.probe"  # the step measured its CPU thread count again (CpuThreadsProbe)
    PP_RECV = "pp.recv"
    PP_SEND = "pp.send"
    # One trace for start-up (vLLM 0.32 names the root the same).
    OVERALL_LOADING = "Overall Loading"
    CREATE_ENGINE_CONFIG = "Create engine config"
    LOAD_TOKENIZER = "Load tokenizer"
    START_ENGINE_CORE = "Start engine core"
    ENGINE_CORE_INIT = Phase.ENGINE_CORE_INIT
    LOAD_MODEL = Phase.LOAD_MODEL
    ALLOCATE_KV_CACHE = Phase.ALLOCATE_KV_CACHE
    WARMUP = Phase.WARMUP
    CAPTURE_CUDA_GRAPHS = Phase.CAPTURE_CUDA_GRAPHS
    PROFILE_STEPS = Phase.PROFILE_STEPS


STEP_STAGES = stages.STEP_STAGES
STEP_PARTS = stages.STEP_PARTS  # each stage's host parts, in the order they run
# The engine core's start-up phases, in the order they run.
ENGINE_CORE_PHASES = stages.ENGINE_CORE_PHASES
STARTUP_SPANS = frozenset({SpanName.OVERALL_LOADING, SpanName.CREATE_ENGINE_CONFIG, SpanName.LOAD_TOKENIZER,
                           SpanName.START_ENGINE_CORE, SpanName.ENGINE_CORE_INIT, *ENGINE_CORE_PHASES})


class EventName:
    """Span events. On ``scheduler.request``: the request's life in the engine core."""

    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    RESUMED = "RESUMED"
    PREFILL_CHUNK = "prefill.chunk"
    PREEMPTED = "PREEMPTED"
    WAITING = "WAITING"  # why a waiting request was not scheduled (once per change of reason)
    FINISHED = "FINISHED"
    # On llm_request.
    ENGINE_CORE_REQUEST = "EngineCoreRequest"
    REQUEST_OUTPUT = "RequestOutput"


class GenAI:
    """OpenTelemetry's GenAI semantic conventions (current), on ``llm_request`` only."""

    OPERATION_NAME = "gen_ai.operation.name"  # "chat" or "text_completion"
    PROVIDER_NAME = "gen_ai.provider.name"
    REQUEST_MODEL = "gen_ai.request.model"
    RESPONSE_MODEL = "gen_ai.response.model"
    RESPONSE_ID = "gen_ai.response.id"
    RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
    REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    REQUEST_TOP_P = "gen_ai.request.top_p"
    REQUEST_TOP_K = "gen_ai.request.top_k"
    REQUEST_SEED = "gen_ai.request.seed"
    REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
    USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
    USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
    # Only with --trace-include-text: JSON in the conventions' parts form.
    INPUT_MESSAGES = "gen_ai.input.messages"
    OUTPUT_MESSAGES = "gen_ai.output.messages"
    SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"


class GenAIValue:
    """The values tracevllm gives GenAI keys, the same on ``llm_request`` and on the
    ``gen_ai.server.*`` metrics (``metrics/genai.py``)."""

    CHAT = "chat"  # gen_ai.operation.name: /v1/chat/completions, LLM.chat
    TEXT_COMPLETION = "text_completion"  # /v1/completions, LLM.generate
    # gen_ai.provider.name. The conventions' well-known values (openai, aws.bedrock, ...) name hosted
    # APIs, none a self-hosted engine, where "a custom value MAY be used": the engine's own name.
    PROVIDER = "tracevllm"


class VllmAttr:
    """vLLM's own names on its ``llm_request`` span (``vllm/tracing/utils.py``), kept alongside."""

    REQUEST_ID = "gen_ai.request.id"
    REQUEST_N = "gen_ai.request.n"
    USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    USAGE_CACHED_TOKENS = "gen_ai.usage.cached_tokens"
    LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    LATENCY_E2E = "gen_ai.latency.e2e"
    LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


class Attr:
    """tracevllm's own attributes (no ``gen_ai.*`` outside llm_request)."""

    # A request, on the spans and events below llm_request.
    REQUEST_ID = "request.id"
    NUM_PROMPT_TOKENS = "request.num_prompt_tokens"
    PROMPT_TYPE = "request.prompt_type"  # "text" or "token_ids"
    PRIORITY = "request.priority"
    # On scheduler.request, from the start (core/events.py's RequestWorkload): the request as a replay
    # submits it again. The hashes are hex, one per full prompt block of request.block_size tokens.
    REQUEST_BLOCK_SIZE = "request.block_size"
    PROMPT_BLOCK_HASHES = "request.prompt_block_hashes"
    MAX_TOKENS = "request.max_tokens"
    MIN_TOKENS = "request.min_tokens"
    IGNORE_EOS = "request.ignore_eos"
    PROMPT_LOGPROBS = "request.prompt_logprobs"  # it asked for prompt logprobs: it skips the prefix cache
    NUM_OUTPUT_TOKENS = "request.num_output_tokens"
    NUM_CACHED_TOKENS = "request.num_cached_tokens"
    NUM_PREEMPTIONS = "request.num_preemptions"
    FINISH_REASON = "request.finish_reason"
    STEPS = "request.steps"  # the engine steps that computed tokens of the request, as ranges: "1-3, 7-9"
    NUM_STEPS = "request.num_steps"
    FIRST_STEP = "request.first_step"
    LAST_STEP = "request.last_step"
    # On scheduler.request events.
    STEP = "step"
    NUM_NEW_TOKENS = "num_new_tokens"
    NUM_COMPUTED_TOKENS = "num_computed_tokens"
    BLOCK_IDS = "block_ids"
    CACHED_BLOCK_IDS = "cached_block_ids"
    EVENT_FINISH_REASON = "finish_reason"
    # On WAITING: why (core/events.py's WaitingReason), who, and, for kv_cache, the blocks.
    WAITING_REASON = "reason"
    BLOCKED_BY = "blocked_by"
    NUM_BLOCKS_NEEDED = "num_blocks_needed"
    NUM_FREE_BLOCKS = "num_free_blocks"
    FULL_SEQUENCE = "full_sequence"  # the blocks needed are the whole prompt's (scheduler_reserve_full_isl)
    NUM_WATERMARK_BLOCKS = "num_watermark_blocks"  # free blocks the watermark keeps
    # On PREEMPTED: who needed the blocks (and NUM_BLOCKS_NEEDED, NUM_FREE_BLOCKS), and the work lost.
    FORCED_BY = "forced_by"
    PREEMPTION_POLICY = "policy"
    NUM_LOST_TOKENS = "num_lost_tokens"
    # On SCHEDULED / RESUMED: the prefix-cache lookup, and why it stopped (tracing/prefix_history.py).
    PREFIX_NUM_BLOCKS_LOOKED_UP = "prefix.num_blocks_looked_up"
    PREFIX_NUM_BLOCKS_HIT = "prefix.num_blocks_hit"
    PREFIX_MISS_REASON = "prefix.miss_reason"
    PREFIX_MISS_EVICTED_STEP = "prefix.miss_evicted_step"
    PREFIX_MISS_EVICTED_FOR = "prefix.miss_evicted_for"
    # Added on export (viz/why_attributes.py), on scheduler.request and llm_request: where the e2e went.
    WHY_PREFIX = "why."  # why.<part>: seconds, one per part of viz/explain.py's PARTS
    WHY_BLAMED_REQUEST_IDS = "why.blamed.request_ids"
    WHY_BLAMED_SECONDS = "why.blamed.seconds"
    # On detokenize.
    DETOKENIZE_NUM_TOKENS = "detokenize.num_tokens"
    DETOKENIZE_TIME = "detokenize.time_s"
    # worker.execute_model: which rank, and its communication.
    WORKER_RANK = "worker.rank"
    WORKER_TP_RANK = "worker.tp_rank"
    WORKER_PP_RANK = "worker.pp_rank"
    WORKER_NUM_TOKENS = "worker.num_tokens"
    WORKER_COMM_TIME = "worker.comm_time_s"
    # execute_model (CUDA): the device's time for the forward and the logits (torch.cuda.Event pair).
    FORWARD_DEVICE_TIME = "execute_model.forward_device_time_s"
    # engine_step: the batch.
    STEP_NUMBER = "step.number"
    STEP_BATCH_SIZE = "step.batch_size"
    STEP_NUM_SCHEDULED_TOKENS = "step.num_scheduled_tokens"
    STEP_TOKEN_BUDGET = "step.token_budget"
    STEP_NUM_PREFILL_TOKENS = "step.num_prefill_tokens"
    STEP_NUM_DECODE_TOKENS = "step.num_decode_tokens"
    STEP_REQ_IDS = "step.req_ids"
    STEP_REQ_NUM_TOKENS = "step.req_num_tokens"
    STEP_REQ_IS_DECODE = "step.req_is_decode"
    STEP_REQ_NUM_COMPUTED_TOKENS = "step.req_num_computed_tokens"  # each request's, before the step
    STEP_PREEMPTED_REQ_IDS = "step.preempted_req_ids"
    # engine_step: the engine after the step.
    STEP_NUM_FREE_BLOCKS = "step.num_free_blocks"
    STEP_NUM_GPU_BLOCKS = "step.num_gpu_blocks"
    STEP_KV_CACHE_USAGE = "step.kv_cache_usage"
    STEP_NUM_RUNNING_REQS = "step.num_running_reqs"
    STEP_NUM_WAITING_REQS = "step.num_waiting_reqs"
    # engine_step: KV block changes, per request, flattened (see blocks_attributes).
    STEP_BLOCKS_ALLOCATED = "step.blocks_allocated"
    STEP_BLOCKS_FREED = "step.blocks_freed"
    STEP_PREFIX_HITS = "step.prefix_hits"
    STEP_BLOCKS_STORED = "step.blocks_stored"
    STEP_BLOCKS_EVICTED = "step.blocks_evicted.block_ids"
    # What the step paid once (a torch.compile: OneTimeCost), and the seconds of each: the step is not
    # a step like the others (traces explain names it; the cost fits leave it out).
    STEP_ONE_TIME_COSTS = "step.one_time_costs"
    STEP_ONE_TIME_COST_SECONDS = "step.one_time_cost_seconds"
    # The step measured the CPU thread count again first (CpuThreadsProbe): its seconds, not the batch's
    # cost either; the step's cpu.threads is the count after. On the probe's span: the counts, the load
    # that set it off (cores' worth used by other processes) and why.
    STEP_CPU_THREADS_PROBE_SECONDS = "step.cpu_threads_probe_seconds"
    CPU_THREADS_BEFORE = "cpu.threads.before"
    CPU_THREADS_AFTER = "cpu.threads.after"
    CPU_OTHERS_LOAD = "cpu.others_load"
    CPU_THREADS_REASON = "cpu.threads.reason"
    # Start-up (the engine core's phases record these: core/stages.py).
    ENGINE = PhaseAttr.ENGINE
    MODEL = PhaseAttr.MODEL
    CPU_THREADS = PhaseAttr.CPU_THREADS
    ATTENTION_BACKEND = PhaseAttr.ATTENTION_BACKEND
    NUM_GPU_BLOCKS = PhaseAttr.NUM_GPU_BLOCKS
    BLOCK_SIZE = PhaseAttr.BLOCK_SIZE
    KV_CACHE_BYTES = PhaseAttr.KV_CACHE_BYTES
    NUM_WARMUP_TOKENS = PhaseAttr.NUM_WARMUP_TOKENS
    STEP_SECONDS_PER_TOKEN = PhaseAttr.STEP_SECONDS_PER_TOKEN
    MAX_NUM_BATCHED_TOKENS = PhaseAttr.MAX_NUM_BATCHED_TOKENS
    CUDA_GRAPH_SIZES = PhaseAttr.CUDA_GRAPH_SIZES
    PROFILE_PREFILL_TOKENS = PhaseAttr.PROFILE_PREFILL_TOKENS
    PROFILE_PREFILL_SECONDS = PhaseAttr.PROFILE_PREFILL_SECONDS
    PROFILE_DECODE_ROWS = PhaseAttr.PROFILE_DECODE_ROWS
    PROFILE_DECODE_SECONDS = PhaseAttr.PROFILE_DECODE_SECONDS
    ONE_TIME_CACHED = "one_time.cached"  # a one-time cost's span: reused from the machine's cache, not built
    MAX_NUM_SEQS = PhaseAttr.MAX_NUM_SEQS
    SCHEDULING_POLICY = PhaseAttr.SCHEDULING_POLICY
    MAX_MODEL_LEN = PhaseAttr.MAX_MODEL_LEN
    ENABLE_CHUNKED_PREFILL = PhaseAttr.ENABLE_CHUNKED_PREFILL
    LONG_PREFILL_TOKEN_THRESHOLD = PhaseAttr.LONG_PREFILL_TOKEN_THRESHOLD
    SCHEDULER_RESERVE_FULL_ISL = PhaseAttr.SCHEDULER_RESERVE_FULL_ISL
    WATERMARK = PhaseAttr.WATERMARK
    ASYNC_SCHEDULING = PhaseAttr.ASYNC_SCHEDULING
    ENABLE_PREFIX_CACHING = PhaseAttr.ENABLE_PREFIX_CACHING
    # The HTTP server span.
    HTTP_REQUEST_METHOD = "http.request.method"
    URL_PATH = "url.path"
    HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
    # The process, on every span's resource.
    PROCESS = "tracevllm.process"
    TRACE_FORMAT = "tracevllm.trace_format"  # TRACE_FORMAT below


# The trace format, on every span's resource (``Attr.TRACE_FORMAT``). 2: the requests carry their
# workload (``request.prompt_block_hashes`` and the sampling parameters) and the steps each request's
# computed tokens (``step.req_num_computed_tokens``). 3: the start-up carries the scheduler's and the KV
# cache's whole configuration (what ``traces whatif`` replays a run from). 4: block 0 is the null block,
# as in vLLM: never held, never free, so the blocks held plus the free ones are ``num_gpu_blocks - 1``
# (``NULL_BLOCK_FORMAT``); a ``kv_cache`` WAITING says whether the blocks needed are the whole prompt's
# and what the watermark keeps free. Traces without it are format 1.
TRACE_FORMAT = 4
NULL_BLOCK_FORMAT = 4

OTLP_PROTOCOLS = ("http/protobuf", "grpc")  # how spans travel to an OTLP receiver (traces push, --otlp-*)


# The values of WAITING's reason (core/events.py's WaitingReason) and of prefix.miss_reason (the
# engine's PrefixMissReason, with "not_cached" told apart by tracing/prefix_history.py).
WAITING_REASONS = ("token_budget", "max_num_seqs", "kv_cache", "preemption", "in_flight", "queued_behind")
PREFIX_MISS_REASONS = ("partial_block", "never_stored", "evicted", "cleared", "prefix_caching_off",
                       "prompt_logprobs")

# A step's block changes are per request, written as three parallel lists: request ``req_ids[i]``
# has the next ``num[i]`` entries of ``block_ids``.
BLOCK_CHANGE_KEYS = ("req_ids", "num", "block_ids")


def block_change_keys(prefix: str) -> tuple[str, str, str]:
    """``("step.blocks_freed.req_ids", "step.blocks_freed.num", "step.blocks_freed.block_ids")``."""
    return tuple(f"{prefix}.{key}" for key in BLOCK_CHANGE_KEYS)  # type: ignore[return-value]
