"""The span table of docs/tracing.md, made from the schema's names (``tracing/schema.py``).

    python -m tracevllm.tracing.schema_doc     # prints the table; docs/tracing.md holds it between
                                              # its "schema table" markers (a test keeps them equal)

One ``SpanDoc`` per span: its name, its service, its parent, who makes it and what it covers, and its
attributes and events, each named through the schema so that a renamed attribute renames its row.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracevllm.tracing.schema import (
    PREFIX_MISS_REASONS, STEP_PARTS, STEP_STAGES, WAITING_REASONS, Attr, EventName, GenAI, Service, SpanName, VllmAttr,
)


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
            f"`{Attr.NUM_FREE_BLOCKS}`), once per change of reason: the queue's head for what stopped the step's "
            f"admissions, every other request `queued_behind` the one ahead of it; `{EventName.PREFILL_CHUNK}` "
            f"(`{Attr.STEP}`, `{Attr.NUM_NEW_TOKENS}`) for each later prompt chunk; `{EventName.PREEMPTED}` "
            f"(`{Attr.STEP}`, `{Attr.NUM_OUTPUT_TOKENS}`, `{Attr.BLOCK_IDS}`: freed, `{Attr.FORCED_BY}`, "
            f"`{Attr.NUM_BLOCKS_NEEDED}`, `{Attr.NUM_FREE_BLOCKS}`, `{Attr.PREEMPTION_POLICY}`, "
            f"`{Attr.NUM_LOST_TOKENS}`); `{EventName.FINISHED}` (`{Attr.EVENT_FINISH_REASON}`, `{Attr.BLOCK_IDS}`: freed). "
            f"Added by `traces jaeger` and `traces push` (`viz/why_attributes.py`): `{Attr.WHY_PREFIX}<part>`, the seconds "
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
            f"(each `.req_ids`, `.num`, `.block_ids`), `{Attr.STEP_BLOCKS_EVICTED}`; when the step paid a "
            f"one-time cost, `{Attr.STEP_ONE_TIME_COSTS}` and `{Attr.STEP_ONE_TIME_COST_SECONDS}`; when it "
            f"measured its CPU thread count again, `{Attr.STEP_CPU_THREADS_PROBE_SECONDS}` and `{Attr.CPU_THREADS}` "
            "(the count after)"),
    SpanDoc("`torch.compile`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_STEP}` (or the start-up phase it ran in)",
            "the engine core's `OneTimeCost` records: a torch.compile in the output rank's forward "
            "(optimisation `compiled_norm_act`, on CUDA), timed by torch's compile callbacks",
            f"`{Attr.ONE_TIME_CACHED}` (false)"),
    SpanDoc(f"`{SpanName.CPU_THREADS_PROBE}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_STEP}`",
            "the engine core's `CpuThreadsProbe` records: before the step's forward, the worker timed its thread "
            "counts again because other processes' load on its cores changed (optimisation "
            "`cpu_thread_follower`, on CPU)",
            f"`{Attr.CPU_THREADS_BEFORE}`, `{Attr.CPU_THREADS_AFTER}`, `{Attr.CPU_OTHERS_LOAD}` (cores' worth used "
            f"by other processes), `{Attr.CPU_THREADS_REASON}`"),
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
            f"`{Attr.MAX_MODEL_LEN}`, `{Attr.ENABLE_CHUNKED_PREFILL}`, `{Attr.LONG_PREFILL_TOKEN_THRESHOLD}`, "
            f"`{Attr.SCHEDULER_RESERVE_FULL_ISL}`, `{Attr.WATERMARK}`, `{Attr.ASYNC_SCHEDULING}`; `{Attr.ENGINE}` (`tracevllm 0.1.0`, or "
            f"`vLLM 0.32.0` for a run recorded inside vLLM by `tracevllm.vllm.TracingScheduler`, whose start-up "
            f"span alone also carries the KV cache's attributes)"),
    SpanDoc(f"`{SpanName.LOAD_MODEL}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_CORE_INIT}`",
            "choosing the CPU threads, building the model, loading its weights and choosing the attention ops",
            f"`{Attr.MODEL}`, `{Attr.ATTENTION_BACKEND}`; on CPU `{Attr.CPU_THREADS}`"),
    SpanDoc("`C++ op <name>`", Service.ENGINE_CORE, f"the start-up phase it ran in (`{SpanName.LOAD_MODEL}`)",
            "the engine core's `OneTimeCost` records: on CPU, each C++ op the output rank built (once per machine) "
            "or loaded from torch's build cache",
            f"`{Attr.ONE_TIME_CACHED}` (loaded, not built)"),
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
    SpanDoc(f"`{SpanName.PROFILE_STEPS}`", Service.ENGINE_CORE, f"`{SpanName.ENGINE_CORE_INIT}`",
            "when the steps are traced: dummy steps timed at a ladder of shapes (prompt chunks of 16 tokens up "
            "to the budget, batches of 1 decode row up to `max_num_seqs`), which `traces fit` and `traces "
            "whatif` read as the shape of a step's cost",
            f"`{Attr.PROFILE_PREFILL_TOKENS}`, `{Attr.PROFILE_PREFILL_SECONDS}`, `{Attr.PROFILE_DECODE_ROWS}`, "
            f"`{Attr.PROFILE_DECODE_SECONDS}`"),
)


def markdown_table() -> str:
    """The span table of docs/tracing.md."""
    lines = ["| span | service | parent | made by / covers | attributes and events |", "|---|---|---|---|---|"]
    for s in SPANS:
        lines.append(f"| {s.name} | `{s.service}` | {s.parent} | {s.made_from} | {s.attributes} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
