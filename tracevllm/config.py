"""Engine configuration: what the user chose (EngineArgs) turned into checked, typed configs.

``EngineArgs`` is the one declaration of the engine options, those of ``LLM(...)`` and of every CLI
command that starts an engine: each field carries its CLI help (and choices) in its metadata, from
which ``EngineArgs.add_cli_args(parser)`` makes the flags. ``EngineArgs.create_engine_config()``
resolves the model (bundled alias, GGUF conversion), reads its Hugging Face config and returns a
``VllmConfig`` whose parts mirror vLLM's: model, cache, scheduler, parallel, device, observability.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from tracevllm.attention.selector import BACKEND_NAMES
from tracevllm.optimizations import OPTIMIZATIONS, OptimizationConfig

if TYPE_CHECKING:  # torch is imported where a device is resolved: the CLI's --help must not wait for it
    import torch


@dataclass
class ModelConfig:
    model: str  # local Hugging Face directory (after resolving aliases and GGUF files)
    hf_config: Any
    dtype: torch.dtype
    max_model_len: int
    seed: int = 0
    # The names clients may use in the API's "model" field; the first is reported back and in metrics.
    served_model_names: list[str] = field(default_factory=list)

    @property
    def architectures(self) -> list[str]:
        return list(getattr(self.hf_config, "architectures", None) or [])

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else self.model.rstrip("/").split("/")[-1]


@dataclass
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    # Exactly this many KV blocks, if set; otherwise as many as kv_cache_memory_bytes holds.
    num_gpu_blocks_override: int | None = None
    # KV budget in bytes; None: 1 GiB on CPU; on CUDA what the loaded model leaves of
    # gpu_memory_utilization x the GPU's total memory, or 90 % of the free memory when that is None
    # too (Worker.determine_num_available_blocks).
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int = 0  # decided by the worker once the model is loaded


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    policy: Literal["fcfs", "priority"] = "fcfs"
    enable_chunked_prefill: bool = True
    # When set (the server on CPU, max_num_batched_tokens not given), the engine core lowers
    # max_num_batched_tokens at start-up until a step of that many tokens measured no longer than
    # this many seconds here (core/sched/token_budget.py).
    target_step_seconds: float | None = None


EXECUTOR_BACKENDS = ("uni", "mp", "ray")


@dataclass
class ParallelConfig:
    """How the model is split over ``world_size = tensor_parallel_size x pipeline_parallel_size``
    processes (ranks): each layer's heads and features over the ``tensor_parallel_size`` ranks of a
    stage, the layers over ``pipeline_parallel_size`` stages; rank ``pp_rank * tp + tp_rank``
    (distributed/parallel_state.py draws it). ``distributed_executor_backend`` runs the ranks: "uni"
    (this process; world size 1 only), "mp" (one process per rank on this machine) or "ray" (Ray
    actors, on one machine or several); None picks "uni" at world size 1, else "mp"."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: Literal["uni", "mp", "ray"] | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        backend = self.distributed_executor_backend
        if backend is None:
            self.distributed_executor_backend = "uni" if self.world_size == 1 else "mp"
        elif backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend must be one of {list(EXECUTOR_BACKENDS)} or None, "
                             f"got {backend!r}.")
        elif backend == "uni" and self.world_size > 1:
            raise ValueError(f"distributed_executor_backend 'uni' runs one process, but tensor_parallel_size x "
                             f"pipeline_parallel_size is {self.world_size}: use 'mp' or 'ray'.")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def verify_with_model(self, hf_config) -> None:
        """ValueError, before any process starts, for a split the model's shapes do not allow: every
        rank must hold a whole number of query heads and of MLP features, and either a whole number
        of KV heads or (tp > num_kv_heads, as in vLLM) one KV head shared by ``tp / num_kv_heads``
        ranks; every stage must hold at least one layer."""
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        num_heads, num_kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
        if num_heads % tp:
            raise ValueError(f"tensor_parallel_size ({tp}) must divide the model's number of attention heads "
                             f"({num_heads}).")
        if tp <= num_kv_heads and num_kv_heads % tp:
            raise ValueError(f"tensor_parallel_size ({tp}) must divide the model's number of KV heads "
                             f"({num_kv_heads}).")
        if tp > num_kv_heads and tp % num_kv_heads:
            raise ValueError(f"tensor_parallel_size ({tp}) is larger than the model's number of KV heads "
                             f"({num_kv_heads}), so it must be a multiple of it (each KV head is replicated "
                             f"on tp / num_kv_heads ranks).")
        if hf_config.intermediate_size % tp:
            raise ValueError(f"tensor_parallel_size ({tp}) must divide the model's intermediate_size "
                             f"({hf_config.intermediate_size}).")
        if pp > hf_config.num_hidden_layers:
            raise ValueError(f"pipeline_parallel_size ({pp}) must be <= the model's number of layers "
                             f"({hf_config.num_hidden_layers}).")


@dataclass
class ObservabilityConfig:
    """Where spans go. Tracing is on when either is set; both together work."""

    trace_out: str | None = None  # directory for OTLP JSON Lines trace files
    otlp_traces_endpoint: str | None = None  # live OTLP export (protocol from OTEL_EXPORTER_OTLP_*_PROTOCOL)
    trace_level: Literal["request", "step"] = "step"  # "request": no engine_step traces
    trace_include_text: bool = False  # prompt and completion text on llm_request (token counts always)

    @property
    def tracing_enabled(self) -> bool:
        return self.trace_out is not None or self.otlp_traces_endpoint is not None


class UsageContext(enum.Enum):
    """Who builds the engine (vLLM's ``UsageContext``): some defaults depend on it."""

    LLM_CLASS = "LLM_CLASS"  # offline: LLM(...), LLMEngine, the benchmarks
    OPENAI_API_SERVER = "OPENAI_API_SERVER"  # online: tracevllm serve (AsyncLLM)


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device: torch.device
    attention_backend: str | None = None
    cpu_threads: int | None = None  # torch threads per rank on CPU; None: chosen at start-up (worker/cpu_threads.py)
    usage_context: UsageContext = UsageContext.LLM_CLASS  # who built the engine: some defaults depend on it
    observability_config: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    optimization_config: OptimizationConfig = field(default_factory=OptimizationConfig.from_names)


def default_max_num_batched_tokens(device: torch.device, usage_context: UsageContext, world_size: int) -> int:
    """vLLM's defaults: 8192 on CUDA; on CPU 4096 offline and 2048 for the server, times the world
    size. A CPU prefills a few thousand tokens a second, and every stream waits for each step:
    one step of ~6,400 prompt tokens froze every stream for up to 48 s on a loaded 2-core machine.
    For the server on CPU this is only the ceiling: ``TARGET_STEP_SECONDS`` fits it to this CPU."""
    if device.type == "cuda":
        return 8192
    return (4096 if usage_context == UsageContext.LLM_CLASS else 2048) * world_size


def default_max_num_seqs(device: torch.device, usage_context: UsageContext, world_size: int) -> int:
    """vLLM's defaults: 256 on CUDA; on CPU 256 offline and 128 for the server, times the world size."""
    if device.type == "cuda":
        return 256
    return (256 if usage_context == UsageContext.LLM_CLASS else 128) * world_size


# The server on CPU, when the user gives no max_num_batched_tokens: the longest a step should take,
# since every stream waits for each one; half a second leaves room for the front end's own work
# within a second between two chunks of a stream.
TARGET_STEP_SECONDS = 0.5


def resolve_device(device: str | torch.device) -> torch.device:
    import torch

    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}.") from e
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}.")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device.")
    return dev


def _option(default: Any, help: str, **cli: Any) -> Any:
    """An EngineArgs field: its default, and in its metadata its CLI help plus what else argparse
    needs: ``choices``, ``flags`` (default ``--field-name``), ``action``, ``nargs``."""
    return field(default=default, metadata={"help": help, **cli})


def _cli_type(hint: Any) -> type:
    """int for ``int`` / ``int | None``, float likewise, str otherwise."""
    members = typing.get_args(hint) or (hint,)
    return next((t for t in (int, float) if t in members), str)


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
    dtype: str = _option(
        "auto", "dtype of weights and activations; auto: the checkpoint's (float32 runs as bfloat16 on CUDA)",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    max_model_len: int | None = _option(
        None, "most tokens (prompt + output) of one request (default: the model's max_position_embeddings)"
    )
    block_size: int = _option(16, "tokens per KV-cache block, a power of two in [1, 128]")
    num_gpu_blocks: int | None = _option(
        None, "exactly this many KV-cache blocks (default: as many as the KV budget holds)",
        flags=("--num-gpu-blocks-override",),
    )
    kv_cache_memory_bytes: int | None = _option(
        None, "KV-cache budget in bytes, overriding gpu_memory_utilization (default: 1 GiB on CPU; on CUDA, "
              "from gpu_memory_utilization)"
    )
    gpu_memory_utilization: float | None = _option(
        None, "share of the GPU's total memory this engine may use, in (0, 1]: the KV cache gets what this "
              "process already holds (the loaded model) leaves of it, as in vLLM; CUDA only, and ignored when "
              "kv_cache_memory_bytes or num_gpu_blocks is set (default: 90 % of the free GPU memory once the "
              "model is loaded, about vLLM's 0.9 on an idle GPU, and room for a second engine)"
    )
    enable_prefix_caching: bool = _option(True, "reuse the KV blocks of prompt prefixes seen before")
    max_num_seqs: int | None = _option(
        None, "most requests in one engine step (default: as vLLM's, 256; on CPU 256 offline and 128 for the "
              "server, times tensor_parallel_size x pipeline_parallel_size)"
    )
    max_num_batched_tokens: int | None = _option(
        None, "most tokens in one engine step; every stream waits for each step, so one step's prefill must "
              "stay short (on CPU a step of ~6,400 prompt tokens froze every stream for up to 48 s on a loaded "
              "2-core machine) (default: as vLLM's, 8192 on CUDA; on CPU 4096 offline and for the server 2048, "
              "times tensor_parallel_size x pipeline_parallel_size, lowered at start-up to what this CPU runs in "
              "half a second per step, measured on a dummy prefill; at least max_num_seqs, and with chunked "
              "prefill off at least max_model_len)"
    )
    enable_chunked_prefill: bool = _option(
        True, "prefill long prompts over several steps; off: in one step, so max_num_batched_tokens must be "
              ">= max_model_len"
    )
    scheduling_policy: str = _option(
        "fcfs", "fcfs: first come, first served; priority: lowest request priority value first, ties by arrival",
        choices=("fcfs", "priority"),
    )
    tensor_parallel_size: int = _option(
        1, "ranks (GPUs, or processes on a CPU) to split each layer over; must divide the model's attention "
           "heads", flags=("-tp", "--tensor-parallel-size")
    )
    pipeline_parallel_size: int = _option(
        1, "pipeline stages, each running a consecutive slice of the layers on its own tensor_parallel_size "
           "ranks", flags=("-pp", "--pipeline-parallel-size")
    )
    distributed_executor_backend: str | None = _option(
        None, "how the tensor_parallel_size x pipeline_parallel_size ranks run: uni (this process; one rank), "
              "mp (one process per rank on this machine), ray (Ray actors, on one machine or several) "
              "(default: uni for one rank, else mp)",
        choices=EXECUTOR_BACKENDS,
    )
    enforce_eager: bool = _option(
        False, "vLLM's switch to run without CUDA graphs; accepted for compatibility and changes nothing, since "
               "tracevllm always runs eagerly (it captures no CUDA graphs)"
    )
    seed: int = _option(0, "torch's random seed, set when the worker starts (requests may bring their own)")
    device: str = _option("auto", "auto (CUDA if torch sees one, else CPU), cpu or cuda[:N]")
    cpu_threads: int | None = _option(
        None, "torch threads per rank on CPU (default: measured at start-up: the cores this process may use, "
              "shared among the ranks, or 1 where a small multi-row GEMM ran no faster on them than on one "
              "thread, as when another process keeps a core busy; the log says which and why)"
    )
    attention_backend: str | None = _option(
        None, "cpu, torch or triton (default: auto: triton on CUDA; on CPU, cpu, or torch when all of cpu's "
              "optimisations are off; torch is the plain reference; triton on CPU needs TRITON_INTERPRET=1)",
        choices=BACKEND_NAMES,
    )
    disable_optimizations: list[str] | None = _option(
        None, "turn these optimisations off, to run (and time) the plain code instead: "
              f"{', '.join(OPTIMIZATIONS)}, or all (tracevllm/optimizations.py says what each does)",
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
    trace_level: str = _option(
        "step", "step: also one trace per engine step; request: only the requests' traces",
        choices=("request", "step"),
    )
    trace_include_text: bool = _option(
        False, "put the prompt and completion text on llm_request spans (token counts are always there)",
        action="store_true",
    )

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add the "engine" argument group, one flag per field (vLLM's spelling: ``max_model_len`` is
        ``--max-model-len``, unless the field's ``flags`` say otherwise), its type from the field's
        annotation; a bool field is ``--[no-]flag`` unless its metadata gives an ``action``."""
        hints = typing.get_type_hints(cls)
        group = parser.add_argument_group("engine", "EngineArgs' fields (tracevllm/config.py), as for LLM(...)")
        for f in fields(cls):
            cli = dict(f.metadata)
            help_text = cli.pop("help").replace("%", "%%")  # argparse formats help with %
            flags = cli.pop("flags", ("--" + f.name.replace("_", "-"),))
            if hints[f.name] is bool:
                cli.setdefault("action", argparse.BooleanOptionalAction)
            else:
                cli.setdefault("type", _cli_type(hints[f.name]))
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
            raise ValueError(" ".join(hints) + " The options are EngineArgs' fields (tracevllm/config.py).")
        return cls(**options)

    def create_engine_config(self, usage_context: UsageContext = UsageContext.LLM_CLASS) -> VllmConfig:
        """``usage_context``: who builds the engine; it picks the default ``max_num_batched_tokens``."""
        from transformers import AutoConfig

        from tracevllm.models.loader import BUNDLED_MODEL_ALIAS, BUNDLED_MODEL_NAME, resolve_dtype, resolve_model
        from tracevllm.models.registry import get_model_cls

        device = resolve_device(self.device)
        model_dir = resolve_model(self.model)
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        get_model_cls(list(getattr(hf_config, "architectures", None) or []))  # unsupported: ValueError now
        dtype = resolve_dtype(self.dtype, hf_config, device)

        derived_max_len = getattr(hf_config, "max_position_embeddings", None) or 2048
        max_model_len = self.max_model_len or derived_max_len
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}.")
        if max_model_len > derived_max_len:
            raise ValueError(
                f"max_model_len must be <= the model's max_position_embeddings ({derived_max_len}), "
                f"got {max_model_len}."
            )
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be a power of two in [1, 128], got {self.block_size}.")
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}.")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}.")
        world_size = self.tensor_parallel_size * self.pipeline_parallel_size
        max_num_seqs = (default_max_num_seqs(device, usage_context, world_size) if self.max_num_seqs is None
                        else self.max_num_seqs)
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}.")
        max_num_batched_tokens = self.max_num_batched_tokens or max(
            default_max_num_batched_tokens(device, usage_context, world_size), max_num_seqs,
            0 if self.enable_chunked_prefill else max_model_len,  # a prompt must fit in one step
        )
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens must be >= max_num_seqs ({max_num_seqs}), "
                f"got {max_num_batched_tokens}."
            )
        fit_budget = (device.type == "cpu" and usage_context == UsageContext.OPENAI_API_SERVER
                      and self.max_num_batched_tokens is None and self.enable_chunked_prefill)
        if not self.enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(
                "With chunked prefill off, max_num_batched_tokens must be >= max_model_len "
                f"({max_model_len}), got {max_num_batched_tokens}."
            )
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}.")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}.")
        if self.trace_level not in ("request", "step"):
            raise ValueError(f"trace_level must be 'request' or 'step', got {self.trace_level!r}.")
        parallel_config = ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            distributed_executor_backend=self.distributed_executor_backend,  # type: ignore[arg-type]
        )
        parallel_config.verify_with_model(hf_config)

        served_model_names = [self.served_model_name] if isinstance(self.served_model_name, str) else list(
            self.served_model_name or []
        )
        if not served_model_names:
            bundled = self.model is None or self.model == BUNDLED_MODEL_ALIAS
            served_model_names = [BUNDLED_MODEL_NAME if bundled else self.model]

        return VllmConfig(
            model_config=ModelConfig(model_dir, hf_config, dtype, max_model_len, self.seed, served_model_names),
            cache_config=CacheConfig(
                block_size=self.block_size,
                enable_prefix_caching=self.enable_prefix_caching,
                num_gpu_blocks_override=self.num_gpu_blocks,
                kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                gpu_memory_utilization=self.gpu_memory_utilization,
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                policy=self.scheduling_policy,  # type: ignore[arg-type]
                enable_chunked_prefill=self.enable_chunked_prefill,
                target_step_seconds=TARGET_STEP_SECONDS if fit_budget else None,
            ),
            parallel_config=parallel_config,
            device=device,
            cpu_threads=self.cpu_threads,
            usage_context=usage_context,
            attention_backend=self.attention_backend,
            observability_config=ObservabilityConfig(
                self.trace_out, self.otlp_traces_endpoint, self.trace_level, self.trace_include_text  # type: ignore[arg-type]
            ),
            optimization_config=OptimizationConfig.from_names(self.disable_optimizations),
        )
