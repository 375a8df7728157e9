"""What the user chose: ``EngineArgs``, every engine option, turned into a ``VllmConfig``.

``EngineArgs`` (vLLM's ``vllm/engine/arg_utils.py``) is the one declaration of the engine options,
those of ``LLM(...)`` and of every CLI command that starts an engine: each field carries its CLI help
in its metadata, and its annotation gives the flag's type and, for a ``Literal`` of tracevllm/config.py,
its choices; ``EngineArgs.add_cli_args(parser)`` makes the flags from them.
``EngineArgs.create_engine_config()`` resolves the model, the device and the dtype, fills in the
defaults that depend on them and on the caller, and builds the ``VllmConfig`` (tracevllm/config.py),
whose parts check the values. No component past the engine's constructor sees ``EngineArgs``.

Importing this module loads no torch: the CLI builds its parser from it, and ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from tracevllm.attention.selector import AttentionBackendName
from tracevllm.config import (
    BlockSize, CacheConfig, DistributedExecutorBackend, ModelConfig, ModelDType, ObservabilityConfig, ParallelConfig,
    SchedulerConfig, SchedulerPolicy, TraceLevel, UsageContext, VllmConfig, resolve_device,
)
from tracevllm.optimizations import OPTIMIZATIONS, OptimizationConfig

if TYPE_CHECKING:  # torch is imported where a device is resolved: the CLI's --help must not wait for it
    import torch

# The server on CPU, when the user gives no max_num_batched_tokens: the longest a step should take,
# since every stream waits for each one; half a second leaves room for the front end's own work
# within a second between two chunks of a stream.
TARGET_STEP_SECONDS = 0.5


def default_max_num_batched_tokens(device: torch.device, usage_context: UsageContext, world_size: int) -> int:
    """vLLM's defaults: 8192 on CUDA; on CPU 4096 offline and 2048 for the server, times the world
    size. A CPU prefills a few thousand tokens a second, and every stream waits for each step
    (docs/perf-log.md#source-figures).
    For the server on CPU this is only the ceiling: ``TARGET_STEP_SECONDS`` fits it to this CPU."""
    if device.type == "cuda":
        return 8192
    return (4096 if usage_context == UsageContext.LLM_CLASS else 2048) * world_size


def default_max_num_seqs(device: torch.device, usage_context: UsageContext, world_size: int) -> int:
    """vLLM's defaults: 256 on CUDA; on CPU 256 offline and 128 for the server, times the world size."""
    if device.type == "cuda":
        return 256
    return (256 if usage_context == UsageContext.LLM_CLASS else 128) * world_size


def _option(default: Any, help: str, **cli: Any) -> Any:
    """An EngineArgs field: its default, and in its metadata its CLI help plus what else argparse
    needs beyond what the annotation says: ``choices`` (of a field that is no ``Literal``), ``flags``
    (default ``--field-name``), ``action``, ``nargs``."""
    return field(default=default, metadata={"help": help, **cli})


def _cli_kwargs(hint: Any) -> dict[str, Any]:
    """argparse's ``type`` (and ``choices``) for a field's annotation, ``X | None`` read as ``X``: a
    ``Literal``'s values are the choices and their type the type; ``int`` and ``float`` are
    themselves; anything else is read as a string."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    literal = next((m for m in members if typing.get_origin(m) is Literal), None)
    if literal is not None:
        choices = typing.get_args(literal)
        return {"type": type(choices[0]), "choices": choices}
    return {"type": next((t for t in (int, float) if t in members), str)}


@dataclass
class EngineArgs:
    """Every user-facing engine option, with vLLM's names and defaults where they apply.

    The single list of them: ``LLM(**options)`` takes these fields as keywords, and every CLI command
    that starts an engine gets one flag per field from ``add_cli_args`` (``tracevllm serve --help``).
    A help without "(default: ...)" of its own gets "(default: <the field's default>)" appended.
    """

    model: str | None = _option(None, "HF directory, .gguf file, or 'smollm2' (default: the bundled 'smollm2')")
    served_model_name: str | list[str] | None = _option(
        None, "the name(s) clients use in the model field (default: the model as given; bundled: its name)",
        nargs="+",
    )
    dtype: ModelDType = _option(
        "auto", "dtype of weights and activations; auto: the checkpoint's (float32 runs as bfloat16 on CUDA)"
    )
    max_model_len: int | None = _option(
        None, "most tokens (prompt + output) of one request (default: the model's max_position_embeddings)"
    )
    block_size: BlockSize = _option(16, "tokens per KV-cache block")
    num_gpu_blocks_override: int | None = _option(
        None, "exactly this many KV-cache blocks (default: as many as the KV budget holds)"
    )
    kv_cache_memory_bytes: int | None = _option(
        None, "KV-cache budget in bytes, overriding gpu_memory_utilization (default: 1 GiB on CPU; on CUDA, "
              "from gpu_memory_utilization)"
    )
    gpu_memory_utilization: float | None = _option(
        None, "share of the GPU's total memory this engine may use, in (0, 1]: the KV cache gets what this "
              "process already holds (the loaded model) leaves of it, as in vLLM; CUDA only, and ignored when "
              "kv_cache_memory_bytes or num_gpu_blocks_override is set (default: 90 % of the free GPU memory once "
              "the model is loaded, about vLLM's 0.9 on an idle GPU, and room for a second engine)"
    )
    enable_prefix_caching: bool = _option(True, "reuse the KV blocks of prompt prefixes seen before")
    max_num_seqs: int | None = _option(
        None, "most requests in one engine step (default: as vLLM's, 256; on CPU 256 offline and 128 for the "
              "server, times tensor_parallel_size x pipeline_parallel_size)"
    )
    max_num_batched_tokens: int | None = _option(
        None, "most tokens in one engine step; every stream waits for each step, so on a CPU one step's prefill "
              "must stay short (default: 8192 on CUDA; on CPU 4096 offline, and for the server fitted at start-up "
              f"to what this CPU runs in {TARGET_STEP_SECONDS:g} s a step, timed on dummy prefills, between "
              "max_num_seqs and a ceiling of 2048, and logged as 'Token budget: max_num_batched_tokens=N'; on CPU "
              "times tensor_parallel_size x pipeline_parallel_size; at least max_num_seqs; with chunked prefill "
              "off at least max_model_len, and not fitted)"
    )
    enable_chunked_prefill: bool = _option(
        True, "prefill long prompts over several steps; off: in one step, so max_num_batched_tokens must be "
              ">= max_model_len"
    )
    long_prefill_token_threshold: int = _option(
        0, "with chunked prefill, a request with more tokens than this to compute (a long prompt) computes at most "
           "this many a step, so that one long prompt does not take the whole token budget; 0: off, as vLLM's default"
    )
    scheduler_reserve_full_isl: bool = _option(
        True, "admit a waiting request only when the free KV blocks hold its whole prompt, not only its first "
              "chunk, as vLLM does since 0.32 (off: only the first chunk must fit, vLLM's rule before it)"
    )
    watermark: float = _option(
        0.0, "share of the KV blocks, in [0, 1), that admitting a waiting request must leave free while other "
             "requests run, as vLLM's: fewer preemptions, fewer requests at once"
    )
    async_scheduling: bool = _option(
        False, "schedule each step before the previous step's sampled tokens are back, with two batches in "
               "flight, as vLLM does by default (a decode's token is then a placeholder until it arrives)"
    )
    scheduling_policy: SchedulerPolicy = _option(
        "fcfs", "fcfs: first come, first served; priority: lowest request priority value first, ties by arrival"
    )
    tensor_parallel_size: int = _option(
        1, "ranks (GPUs, or processes on a CPU) to split each layer over; must divide the model's attention "
           "heads", flags=("-tp", "--tensor-parallel-size")
    )
    pipeline_parallel_size: int = _option(
        1, "pipeline stages, each running a consecutive slice of the layers on its own tensor_parallel_size "
           "ranks", flags=("-pp", "--pipeline-parallel-size")
    )
    distributed_executor_backend: DistributedExecutorBackend | None = _option(
        None, "how the tensor_parallel_size x pipeline_parallel_size ranks run: uni (this process; one rank), "
              "mp (one process per rank on this machine), ray (Ray actors, on one machine or several) "
              "(default: uni for one rank, else mp)"
    )
    enforce_eager: bool = _option(
        False, "run every step eagerly, capturing no CUDA graphs (as vLLM's switch; the same as disabling the "
               "optimisation cuda_graphs, which only applies on CUDA)"
    )
    seed: int = _option(0, "torch's random seed, set when the worker starts (requests may bring their own)")
    device: str = _option("auto", "auto (CUDA if torch sees one, else CPU), cpu or cuda[:N]")
    cpu_threads: int | None = _option(
        None, "torch threads per rank on CPU (default: measured at start-up: the cores this process may use, "
              "shared among the ranks, or 1 where a small multi-row GEMM ran no faster on them than on one "
              "thread, as when another process keeps a core busy; the log says which and why)"
    )
    attention_backend: AttentionBackendName | None = _option(
        None, "cpu, torch or triton (default: auto: triton on CUDA; on CPU, cpu, or torch when all of cpu's "
              "optimisations are off; torch is the plain reference; triton on CPU needs TRITON_INTERPRET=1)",
    )
    disable_optimizations: list[str] | None = _option(
        None, "turn these optimisations off, to run (and time) the plain code instead: "
              f"{', '.join(OPTIMIZATIONS)}, or all (tracevllm/optimizations.py says what each does) (default: "
              "the names in the environment variable TRACEVLLM_DISABLE_OPTIMIZATIONS, comma-separated, if set; "
              "else none)",
        nargs="+", choices=(*OPTIMIZATIONS, "all"),
    )
    trace_out: str | None = _option(
        None, "directory for OTLP JSON Lines trace files (default: none; tracing is off unless this or "
              "otlp_traces_endpoint is set)"
    )
    otlp_traces_endpoint: str | None = _option(
        None, "export spans live over OTLP (e.g. Jaeger's http://127.0.0.1:4317); the protocol is "
              "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: grpc (default) or http/protobuf"
    )
    trace_level: TraceLevel = _option(
        "step", "step: also one trace per engine step; request: only the requests' traces"
    )
    trace_include_text: bool = _option(
        False, "put the prompt and completion text on llm_request spans (token counts are always there)",
        action="store_true",
    )
    otlp_metrics_endpoint: str | None = _option(
        None, "also export the server's gen_ai.server.* metrics over OTLP (they are always on /metrics); the "
              "protocol is OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: grpc (default) or http/protobuf"
    )

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add the "engine" argument group, one flag per field (vLLM's spelling: ``max_model_len`` is
        ``--max-model-len``, unless the field's ``flags`` say otherwise), its type and choices from the
        field's annotation (``_cli_kwargs``); a bool field is ``--[no-]flag`` unless its metadata gives
        an ``action``."""
        hints = typing.get_type_hints(cls)
        group = parser.add_argument_group("engine", "EngineArgs' fields (tracevllm/engine/arg_utils.py), as for "
                                                    "LLM(...)")
        for f in fields(cls):
            cli = dict(f.metadata)
            help_text = cli.pop("help").replace("%", "%%")  # argparse formats help with %
            flags = cli.pop("flags", ("--" + f.name.replace("_", "-"),))
            if hints[f.name] is bool:
                cli.setdefault("action", argparse.BooleanOptionalAction)
            else:
                cli = {**_cli_kwargs(hints[f.name]), **cli}
            action = group.add_argument(*flags, dest=f.name, default=f.default, help=help_text, **cli)
            if "(default:" not in action.help:  # BooleanOptionalAction may have added it already
                action.help += " (default: %(default)s)"
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """The EngineArgs of a namespace parsed with ``add_cli_args``; its other attributes are ignored."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    @classmethod
    def from_options(cls, options: Mapping[str, Any], caller: str = "EngineArgs()",
                     other_names: Iterable[str] = ()) -> EngineArgs:
        """EngineArgs from user keywords; an unknown one is a ValueError naming it, with the close
        matches among the fields (and ``other_names``, the caller's own parameters)."""
        names = [f.name for f in fields(cls)]
        unknown = [key for key in options if key not in names]
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, [*names, *other_names], n=3)
                suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
                hints.append(f"{caller} got an unknown engine option {key!r}{suggestion}")
            raise ValueError(" ".join(hints) + " The options are EngineArgs' fields (tracevllm/engine/arg_utils.py).")
        return cls(**options)

    def create_engine_config(self, usage_context: UsageContext = UsageContext.LLM_CLASS) -> VllmConfig:
        """The ``VllmConfig`` of these options, for an engine built by ``usage_context``.

        This resolves names (the model: a bundled alias or a GGUF file becomes a local directory, whose
        Hugging Face config is read; the device; the dtype) and fills in the defaults that depend on
        the device, the model or ``usage_context`` (``max_num_seqs``, ``max_num_batched_tokens``, the
        served names); a name it cannot resolve is a ValueError. It checks no value itself: the
        configs do, each in its ``__post_init__`` (tracevllm/config.py), so that a bad value is the
        same ValueError however a config is built."""
        from transformers import AutoConfig

        from tracevllm.models.loader import BUNDLED_MODEL_ALIAS, BUNDLED_MODEL_NAME, resolve_dtype, resolve_model

        device = resolve_device(self.device)
        model_dir = resolve_model(self.model)
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        served_model_names = [self.served_model_name] if isinstance(self.served_model_name, str) else list(
            self.served_model_name or []
        )
        if not served_model_names:
            bundled = self.model is None or self.model == BUNDLED_MODEL_ALIAS
            served_model_names = [BUNDLED_MODEL_NAME if bundled else self.model]
        model_config = ModelConfig(
            model=model_dir, hf_config=hf_config, dtype=resolve_dtype(self.dtype, hf_config, device),
            max_model_len=self.max_model_len, seed=self.seed, served_model_names=served_model_names,
        )
        parallel_config = ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            distributed_executor_backend=self.distributed_executor_backend,
        )

        world_size, max_model_len = parallel_config.world_size, model_config.max_model_len
        max_num_seqs = self.max_num_seqs
        if max_num_seqs is None:
            max_num_seqs = default_max_num_seqs(device, usage_context, world_size)
        max_num_batched_tokens = self.max_num_batched_tokens
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(
                default_max_num_batched_tokens(device, usage_context, world_size), max_num_seqs,
                0 if self.enable_chunked_prefill else max_model_len,  # a prompt must fit in one step
            )
        # The server on CPU with the budget not given: the engine core fits the budget to this CPU.
        fit_budget = (device.type == "cpu" and usage_context == UsageContext.OPENAI_API_SERVER
                      and self.max_num_batched_tokens is None and self.enable_chunked_prefill)

        # The engine reads the environment here, once: None means $TRACEVLLM_DISABLE_OPTIMIZATIONS' names.
        optimization_config = OptimizationConfig.from_names(self.disable_optimizations)
        if self.enforce_eager:
            optimization_config = OptimizationConfig(optimization_config.disabled | {"cuda_graphs"})
        return VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size,
                enable_prefix_caching=self.enable_prefix_caching,
                num_gpu_blocks_override=self.num_gpu_blocks_override,
                kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                gpu_memory_utilization=self.gpu_memory_utilization,
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                policy=self.scheduling_policy,
                enable_chunked_prefill=self.enable_chunked_prefill,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
                scheduler_reserve_full_isl=self.scheduler_reserve_full_isl,
                watermark=self.watermark,
                async_scheduling=self.async_scheduling,
                target_step_seconds=TARGET_STEP_SECONDS if fit_budget else None,
            ),
            parallel_config=parallel_config,
            device=device,
            cpu_threads=self.cpu_threads,
            usage_context=usage_context,
            attention_backend=self.attention_backend,
            observability_config=ObservabilityConfig(
                self.trace_out, self.otlp_traces_endpoint, self.trace_level, self.trace_include_text,
                self.otlp_metrics_endpoint,
            ),
            optimization_config=optimization_config,
        )
