"""The engine's configuration, as vLLM's ``vllm/config/``: a ``VllmConfig`` and its parts.

``EngineArgs.create_engine_config()`` (tracevllm/engine/arg_utils.py) turns the user's options into a
``VllmConfig``; every component reads its part of it: model, cache, scheduler, parallel,
observability, optimisations.

The values are checked here and only here, as vLLM checks them: each config's ``__post_init__``
checks its own fields, and ``VllmConfig.__post_init__`` what spans two parts (the parallel split
against the model's shapes), so that a config cannot be built with a bad value, however it is built.
A bad value is a ValueError naming the option and what it may be. A choice among names is a
``Literal`` defined once below; the checks and the CLI's choices read it (``typing.get_args``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from tracevllm.optimizations import OptimizationConfig

if TYPE_CHECKING:  # torch is imported where a device is resolved: the CLI's --help must not wait for it
    import torch

ModelDType = Literal["auto", "float32", "bfloat16", "float16"]  # auto: the checkpoint's (models/loader.py)
BlockSize = Literal[1, 2, 4, 8, 16, 32, 64, 128]
SchedulerPolicy = Literal["fcfs", "priority"]
DistributedExecutorBackend = Literal["uni", "mp", "ray"]
TraceLevel = Literal["request", "step"]


def _check_choice(name: str, value: Any, choices: Any) -> None:
    """ValueError unless ``value`` is one of the ``Literal`` ``choices``."""
    if value not in get_args(choices):
        raise ValueError(f"{name} must be one of {list(get_args(choices))}, got {value!r}.")


@dataclass
class ModelConfig:
    model: str  # local Hugging Face directory (after resolving aliases and GGUF files)
    hf_config: Any
    dtype: torch.dtype
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    seed: int = 0
    # The names clients may use in the API's "model" field; the first is reported back and in metrics.
    served_model_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from tracevllm.models.registry import get_model_cls

        get_model_cls(self.architectures)  # an architecture tracevllm does not implement: ValueError now
        positions = getattr(self.hf_config, "max_position_embeddings", None) or 2048
        if self.max_model_len is None:
            self.max_model_len = positions
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}.")
        if self.max_model_len > positions:
            raise ValueError(f"max_model_len must be <= the model's max_position_embeddings ({positions}), "
                             f"got {self.max_model_len}.")

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
    block_size: BlockSize = 16
    enable_prefix_caching: bool = True
    # Exactly this many KV blocks, if set; otherwise as many as kv_cache_memory_bytes holds.
    num_gpu_blocks_override: int | None = None
    # KV budget in bytes; None: 1 GiB on CPU; on CUDA what the loaded model leaves of
    # gpu_memory_utilization x the GPU's total memory, or 90 % of the free memory when that is None
    # too (Worker.determine_num_available_blocks).
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int = 0  # decided by the worker once the model is loaded (EngineCore._initialize_kv_caches)

    def __post_init__(self) -> None:
        _check_choice("block_size", self.block_size, BlockSize)
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(f"num_gpu_blocks_override must be >= 1, got {self.num_gpu_blocks_override}.")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    policy: SchedulerPolicy = "fcfs"  # the option scheduling_policy
    enable_chunked_prefill: bool = True
    # > 0: a request with more tokens than this to compute (a long prompt) computes this many a step,
    # leaving the rest of the budget to others (vLLM's, for chunked prefill); 0: as many as the budget allows.
    long_prefill_token_threshold: int = 0
    # vLLM's admission rule (its default since 0.32): a waiting request is admitted only when the free
    # blocks hold its whole prompt, not only this step's chunk (KVCacheManager.allocate_slots).
    scheduler_reserve_full_isl: bool = True
    # Share of the KV blocks an admission must leave free while other requests run (vLLM's, default 0).
    watermark: float = 0.0
    # Schedule step N+1 before step N's tokens are back (core/sched/async_scheduler.py), two batches
    # in flight; vLLM's default.
    async_scheduling: bool = False
    # When set (the server on CPU, max_num_batched_tokens not given), the engine core lowers
    # max_num_batched_tokens at start-up until a step of that many tokens measured no longer than
    # this many seconds here (core/sched/token_budget.py).
    target_step_seconds: float | None = None

    def __post_init__(self) -> None:
        _check_choice("scheduling_policy", self.policy, SchedulerPolicy)
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}.")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens must be >= max_num_seqs ({self.max_num_seqs}), "
                             f"got {self.max_num_batched_tokens}.")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError("With chunked prefill off, max_num_batched_tokens must be >= max_model_len "
                             f"({self.max_model_len}), got {self.max_num_batched_tokens}.")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}.")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}.")
        if self.long_prefill_token_threshold and not self.enable_chunked_prefill:
            raise ValueError("long_prefill_token_threshold cuts prompts into chunks: it needs enable_chunked_prefill.")


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
    distributed_executor_backend: DistributedExecutorBackend | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        backend = self.distributed_executor_backend
        if backend is None:
            self.distributed_executor_backend = "uni" if self.world_size == 1 else "mp"
            return
        _check_choice("distributed_executor_backend", backend, DistributedExecutorBackend)
        if backend == "uni" and self.world_size > 1:
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
    """Where spans go (tracing is on when either of the first two is set; both together work), and
    where the server's OpenTelemetry metrics go besides ``GET /metrics``."""

    trace_out: str | None = None  # directory for OTLP JSON Lines trace files
    otlp_traces_endpoint: str | None = None  # live OTLP export (protocol from OTEL_EXPORTER_OTLP_*_PROTOCOL)
    trace_level: TraceLevel = "step"  # "request": no engine_step traces
    trace_include_text: bool = False  # prompt and completion text on llm_request (token counts always)
    otlp_metrics_endpoint: str | None = None  # the gen_ai.server.* metrics over OTLP (metrics/genai.py)

    def __post_init__(self) -> None:
        _check_choice("trace_level", self.trace_level, TraceLevel)

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
    # All on by default; EngineArgs.create_engine_config reads --disable-optimizations or the environment.
    optimization_config: OptimizationConfig = field(default_factory=OptimizationConfig)

    def __post_init__(self) -> None:
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}.")
        if self.scheduler_config.async_scheduling and self.parallel_config.pipeline_parallel_size > 1:
            raise ValueError("async_scheduling does not run with pipeline parallelism (nor does it in vLLM's V1 "
                             "model runner): pass one of them only.")
        self.parallel_config.verify_with_model(self.model_config.hf_config)

    @property
    def max_concurrent_batches(self) -> int:
        """Batches the engine core keeps in flight: one per pipeline stage, or two when it schedules
        asynchronously (the next batch is scheduled while the last one runs)."""
        return 2 if self.scheduler_config.async_scheduling else self.parallel_config.pipeline_parallel_size


def resolve_device(device: str | torch.device) -> torch.device:
    """The option ``device`` as a torch device: "auto" is CUDA if torch sees one, else the CPU."""
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
