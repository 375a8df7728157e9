"""The trace schema: every span, span event and attribute tracevllm writes, named once.

The observers in ``tracevllm/tracing/`` write these names, ``viz/`` reads them, and the tables of
``docs/tracing.md`` are generated from ``SPANS`` below (``python -m tracevllm.tracing.schema``; a test
keeps the document equal to the output). The engine core's stages and start-up phases, and what the
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

from dataclasses import dataclass

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
    # Added on export (tracing/why.py), on scheduler.request and llm_request: where the e2e went.
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
    # Start-up (the engine core's phases record these: core/stages.py).
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
    MAX_NUM_SEQS = PhaseAttr.MAX_NUM_SEQS
    SCHEDULING_POLICY = PhaseAttr.SCHEDULING_POLICY
    MAX_MODEL_LEN = PhaseAttr.MAX_MODEL_LEN
    ENABLE_CHUNKED_PREFILL = PhaseAttr.ENABLE_CHUNKED_PREFILL
    LONG_PREFILL_TOKEN_THRESHOLD = PhaseAttr.LONG_PREFILL_TOKEN_THRESHOLD
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
# cache's whole configuration (what ``traces whatif`` replays a run from). Traces without it are format 1.
TRACE_FORMAT = 3


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


@dataclass(frozen=True)
class SpanDoc:
    """One row of the span table in docs/tracing.md."""

    name: str
    service: str
    parent: str
    made_from: str
    attributes: str


SPANS: tuple[SpanDoc, ...] = (
    SpanDoc("`POST /v1/...`", Service.FRONTEND, "the caller's span (incoming `traceparent`), else none",
            "`tracing/http.py`, around each API request (kind SERVER)",
            f"`{Attr.HTTP_REQUEST_METHOD}`, `{Attr.URL_PATH}`, `{Attr.HTTP_RESPONSE_STATUS_CODE}`; status "
            "ERROR when the client left or on a 5xx"),
    SpanDoc(f"`{SpanName.LLM_REQUEST}`", Service.FRONTEND, "the server span; offline, the caller's current span",
            "`RequestTracer`, from arrival to the last output",
            f"GenAI conventions: `{GenAI.OPERATION_NAME}` (`chat` or `text_completion`), `{GenAI.PROVIDER_NAME}`, "
            f"`{GenAI.REQUEST_MODEL}`, `{GenAI.RESPONSE_MODEL}`, `{GenAI.RESPONSE_ID}`, `{GenAI.REQUEST_MAX_TOKENS}`, "
            f"`{GenAI.REQUEST_TEMPERATURE}`, `{GenAI.REQUEST_TOP_P}`, `{GenAI.REQUEST_TOP_K}`, `{GenAI.REQUEST_SEED}`, "
            f"`{GenAI.REQUEST_CHOICE_COUNT}`, `{GenAI.USAGE_INPUT_TOKENS}`, `{GenAI.USAGE_OUTPUT_TOKENS}`, "
            f"`{GenAI.USAGE_CACHE_READ_INPUT_TOKENS}`, `{GenAI.RESPONSE_FINISH_REASONS}`; with "
            f"`--trace-include-text`, `{GenAI.INPUT_MESSAGES}`, `{GenAI.OUTPUT_MESSAGES}`, "
            f"`{GenAI.SYSTEM_INSTRUCTIONS}`. vLLM's names: `{VllmAttr.REQUEST_ID}`, `{VllmAttr.REQUEST_N}`, "
            f"`{VllmAttr.USAGE_PROMPT_TOKENS}`, `{VllmAttr.USAGE_COMPLETION_TOKENS}`, "
            f"`{VllmAttr.USAGE_CACHED_TOKENS}`, `{VllmAttr.LATENCY_TIME_IN_QUEUE}`, "
            f"`{VllmAttr.LATENCY_TIME_TO_FIRST_TOKEN}`, `{VllmAttr.LATENCY_E2E}`, "
            f"`{VllmAttr.LATENCY_TIME_IN_MODEL_PREFILL}`, `{VllmAttr.LATENCY_TIME_IN_MODEL_DECODE}`, "
            f"`{VllmAttr.LATENCY_TIME_IN_MODEL_INFERENCE}` (seconds). Events: `{EventName.ENGINE_CORE_REQUEST}` "
            f"(`{Attr.REQUEST_ID}`, one per sample), `{EventName.REQUEST_OUTPUT}` (the final one). Added by "
            f"`traces jaeger` and `traces push` when it has one sample: `{Attr.WHY_PREFIX}<part>`, "
            f"`{Attr.WHY_BLAMED_REQUEST_IDS}`, `{Attr.WHY_BLAMED_SECONDS}` (as on `{SpanName.SCHEDULER_REQUEST}`)"),
    SpanDoc(f"`{SpanName.TOKENIZE}`", Service.FRONTEND, f"`{SpanName.LLM_REQUEST}`",
            "`RequestTracer`: arrival until the `EngineCoreRequest` is made (chat template, tokenizer, checks)",
            f"`{Attr.NUM_PROMPT_TOKENS}`, `{Attr.PROMPT_TYPE}`"),
    SpanDoc(f"`{SpanName.SCHEDULER_REQUEST}`", Service.ENGINE_CORE, f"`{SpanName.LLM_REQUEST}` (via `trace_headers`)",
            "`EngineCoreTracer`, from the request's events: queued until its KV blocks are freed",
            f"`{Attr.REQUEST_ID}`, `{Attr.NUM_PROMPT_TOKENS}`, `{Attr.PRIORITY}`; its workload (what a replay "
            f"submits again, `viz/workload.py`): `{Attr.PROMPT_BLOCK_HASHES}` (hex, one per full prompt block of "
            f"`{Attr.REQUEST_BLOCK_SIZE}` tokens, chained as the prefix cache chains them; made even with prefix "
            f"caching off), `{Attr.MAX_TOKENS}`, `{Attr.MIN_TOKENS}`, `{Attr.IGNORE_EOS}`, `{Attr.PROMPT_LOGPROBS}`; "
            f"at the end "
            f"`{Attr.NUM_OUTPUT_TOKENS}`, `{Attr.NUM_CACHED_TOKENS}`, `{Attr.NUM_PREEMPTIONS}`, "
            f"`{Attr.FINISH_REASON}`, `{Attr.STEPS}` (ranges: `1-3, 7-9`), `{Attr.NUM_STEPS}`, `{Attr.FIRST_STEP}`, "
            f"`{Attr.LAST_STEP}`. Events: "
            f"`{EventName.QUEUED}`; `{EventName.SCHEDULED}` and `{EventName.RESUMED}` (`{Attr.STEP}`, "
            f"`{Attr.NUM_NEW_TOKENS}`, `{Attr.NUM_COMPUTED_TOKENS}`: the prefix-cache hit, "
            f"`{Attr.CACHED_BLOCK_IDS}`, `{Attr.BLOCK_IDS}`: new blocks; the lookup: "
            f"`{Attr.PREFIX_NUM_BLOCKS_LOOKED_UP}`, `{Attr.PREFIX_NUM_BLOCKS_HIT}`, `{Attr.PREFIX_MISS_REASON}` "
            f"(`{'`, `'.join(PREFIX_MISS_REASONS)}`), for `evicted` `{Attr.PREFIX_MISS_EVICTED_STEP}` and "
            f"`{Attr.PREFIX_MISS_EVICTED_FOR}`); `{EventName.WAITING}` (`{Attr.STEP}`, `{Attr.WAITING_REASON}`: "
            f"`{'`, `'.join(WAITING_REASONS)}`; `{Attr.BLOCKED_BY}`, `{Attr.NUM_BLOCKS_NEEDED}`, "
            f"`{Attr.NUM_FREE_BLOCKS}`), once per change of reason; `{EventName.PREFILL_CHUNK}` "
            f"(`{Attr.STEP}`, `{Attr.NUM_NEW_TOKENS}`) for each later prompt chunk; `{EventName.PREEMPTED}` "
            f"(`{Attr.STEP}`, `{Attr.NUM_OUTPUT_TOKENS}`, `{Attr.BLOCK_IDS}`: freed, `{Attr.FORCED_BY}`, "
            f"`{Attr.NUM_BLOCKS_NEEDED}`, `{Attr.NUM_FREE_BLOCKS}`, `{Attr.PREEMPTION_POLICY}`, "
            f"`{Attr.NUM_LOST_TOKENS}`); `{EventName.FINISHED}` (`{Attr.EVENT_FINISH_REASON}`, `{Attr.BLOCK_IDS}`: freed). "
            f"Added by `traces jaeger` and `traces push` (`tracing/why.py`): `{Attr.WHY_PREFIX}<part>`, the seconds "
            f"of its e2e charged to each cause (`viz/explain.py`), `{Attr.WHY_BLAMED_REQUEST_IDS}` and "
            f"`{Attr.WHY_BLAMED_SECONDS}`, the other requests charged most"),
    SpanDoc(f"`{SpanName.PREFILL}`", Service.FRONTEND, f"`{SpanName.LLM_REQUEST}`",
            "`RequestTracer`, from the request's stats: first scheduled until the first token",
            f"`{Attr.REQUEST_ID}` (with n > 1: one per sample)"),
    SpanDoc(f"`{SpanName.DECODE}`", Service.FRONTEND, f"`{SpanName.LLM_REQUEST}`",
            "`RequestTracer`: first token until the last (a recomputation after preemption falls in here)",
            f"`{Attr.REQUEST_ID}` (with n > 1), `{Attr.NUM_OUTPUT_TOKENS}`, `{Attr.NUM_PREEMPTIONS}`"),
    SpanDoc(f"`{SpanName.DETOKENIZE}`", Service.FRONTEND, f"`{SpanName.LLM_REQUEST}`",
            "`RequestTracer`: first until last output, one span for all of the request's detokenizing",
            f"`{Attr.REQUEST_ID}` (with n > 1), `{Attr.DETOKENIZE_NUM_TOKENS}`, `{Attr.DETOKENIZE_TIME}` "
            "(time spent in the detokenizer, stop strings included)"),
    SpanDoc(f"`{SpanName.ENGINE_STEP}`", Service.ENGINE_CORE,
            f"none (one trace per step); linked to the `{SpanName.SCHEDULER_REQUEST}` of every request it ran",
            "`EngineCoreTracer`, from the step's `StepRecord` (`--trace-level step`)",
            f"`{Attr.STEP_NUMBER}`, `{Attr.STEP_BATCH_SIZE}`, `{Attr.STEP_NUM_SCHEDULED_TOKENS}`, "
            f"`{Attr.STEP_TOKEN_BUDGET}`, `{Attr.STEP_NUM_PREFILL_TOKENS}`, `{Attr.STEP_NUM_DECODE_TOKENS}`, "
            f"`{Attr.STEP_REQ_IDS}`, `{Attr.STEP_REQ_NUM_TOKENS}`, `{Attr.STEP_REQ_IS_DECODE}`, "
            f"`{Attr.STEP_REQ_NUM_COMPUTED_TOKENS}` (before the step), "
            f"`{Attr.STEP_PREEMPTED_REQ_IDS}`; after the step `{Attr.STEP_NUM_FREE_BLOCKS}`, "
            f"`{Attr.STEP_NUM_GPU_BLOCKS}`, `{Attr.STEP_KV_CACHE_USAGE}`, `{Attr.STEP_NUM_RUNNING_REQS}`, "
            f"`{Attr.STEP_NUM_WAITING_REQS}`; block changes `{Attr.STEP_BLOCKS_ALLOCATED}.*`, "
            f"`{Attr.STEP_BLOCKS_FREED}.*`, `{Attr.STEP_PREFIX_HITS}.*`, `{Attr.STEP_BLOCKS_STORED}.*` "
            f"(each `.req_ids`, `.num`, `.block_ids`), `{Attr.STEP_BLOCKS_EVICTED}`"),
    *(SpanDoc(f"`{stage}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_STEP}`",
              f"the `StepRecord`'s duration of `{stage}`",
              f"on CUDA `{Attr.FORWARD_DEVICE_TIME}` (when the step samples)" if stage == SpanName.EXECUTE_MODEL
              else "") for stage in STEP_STAGES),
    *(SpanDoc(", ".join(f"`{part}`" for part in parts), Service.ENGINE_CORE, f"`{stage}`",
              "the `StepRecord`'s `parts`: the model runner's host path, laid end to end from the stage's start "
              "(the rest of the stage is the executor's); they add up to no more than the stage", "")
      for stage, parts in STEP_PARTS.items()),
    SpanDoc(f"`{SpanName.WORKER_EXECUTE_MODEL}`", Service.WORKER, f"`{SpanName.ENGINE_STEP}` (of the step that "
            "scheduled the batch)",
            "`WorkerTracer`, in each worker process, from its `WorkerStepRecord` (tensor or pipeline parallelism, "
            "`--trace-level step`): one per rank per batch",
            f"`{Attr.WORKER_RANK}`, `{Attr.WORKER_TP_RANK}`, `{Attr.WORKER_PP_RANK}`, `{Attr.WORKER_NUM_TOKENS}`, "
            f"`{Attr.WORKER_COMM_TIME}` (all-reduces, gathers, sends and receives)"),
    SpanDoc(f"`{SpanName.PP_RECV}`, `{SpanName.PP_SEND}`", Service.WORKER, f"`{SpanName.WORKER_EXECUTE_MODEL}`",
            "a pipeline stage waiting for the previous stage's tensors, and handing its own to the next", ""),
    SpanDoc(f"`{SpanName.OVERALL_LOADING}`", Service.FRONTEND, "none (the start-up trace)",
            "`RequestTracer.startup`, from `LLM(...)` / `AsyncLLM` creation until the engine is ready",
            f"`{Attr.MODEL}`"),
    SpanDoc(f"`{SpanName.CREATE_ENGINE_CONFIG}`", Service.FRONTEND, f"`{SpanName.OVERALL_LOADING}`",
            "resolving the model (converting a GGUF file the first time) and reading its config", ""),
    SpanDoc(f"`{SpanName.LOAD_TOKENIZER}`", Service.FRONTEND, f"`{SpanName.OVERALL_LOADING}`", "", ""),
    SpanDoc(f"`{SpanName.START_ENGINE_CORE}`", Service.FRONTEND, f"`{SpanName.OVERALL_LOADING}`",
            "the engine-core client: the background process started and READY, or the in-process core built",
            ""),
    SpanDoc(f"`{SpanName.ENGINE_CORE_INIT}`", Service.ENGINE_CORE, f"`{SpanName.START_ENGINE_CORE}`",
            "`EngineCoreTracer`, from the engine core's `StartupPhase` records",
            f"the scheduler's configuration, what `traces whatif` replays the run from: `{Attr.MAX_NUM_SEQS}`, "
            f"`{Attr.SCHEDULING_POLICY}` (`fcfs` or `priority`), `{Attr.MAX_NUM_BATCHED_TOKENS}` (as fitted), "
            f"`{Attr.MAX_MODEL_LEN}`, `{Attr.ENABLE_CHUNKED_PREFILL}`, `{Attr.LONG_PREFILL_TOKEN_THRESHOLD}`"),
    SpanDoc(f"`{SpanName.LOAD_MODEL}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_CORE_INIT}`",
            "choosing the CPU threads, building the model, loading its weights and choosing the attention ops",
            f"`{Attr.MODEL}`, `{Attr.ATTENTION_BACKEND}`; on CPU `{Attr.CPU_THREADS}`"),
    SpanDoc(f"`{SpanName.ALLOCATE_KV_CACHE}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_CORE_INIT}`",
            "sizing the KV cache and allocating it",
            f"`{Attr.NUM_GPU_BLOCKS}`, `{Attr.BLOCK_SIZE}`, `{Attr.ENABLE_PREFIX_CACHING}`, `{Attr.KV_CACHE_BYTES}`"),
    SpanDoc(f"`{SpanName.WARMUP}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_CORE_INIT}`",
            "one dummy forward pass and sampling, so the first request does not pay one-time costs; for the "
            "server on CPU, also two timed dummy steps that fit the token budget",
            f"`{Attr.NUM_WARMUP_TOKENS}`; when fitted, `{Attr.STEP_SECONDS_PER_TOKEN}`, "
            f"`{Attr.MAX_NUM_BATCHED_TOKENS}`"),
    SpanDoc(f"`{SpanName.CAPTURE_CUDA_GRAPHS}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_CORE_INIT}`",
            "on CUDA only: capturing one CUDA graph of the decode forward per batch size (optimisation "
            "`cuda_graphs`; none with `enforce_eager`, the torch attention backend, or several ranks)",
            f"`{Attr.CUDA_GRAPH_SIZES}`"),
)


def markdown_table() -> str:
    """The span table of docs/tracing.md."""
    lines = ["| span | service | parent | made by / covers | attributes and events |", "|---|---|---|---|---|"]
    for s in SPANS:
        lines.append(f"| {s.name} | `{s.service}` | {s.parent} | {s.made_from} | {s.attributes} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
