"""Engine configuration: what the user chose (EngineArgs) turned into checked, typed configs.

``EngineArgs`` holds the knobs of ``LLM(...)`` and of the CLI; ``EngineArgs.create_engine_config()``
resolves the model (bundled alias, GGUF conversion), reads its Hugging Face config and returns a
``VllmConfig`` whose parts mirror vLLM's: model, cache, scheduler, parallel, device, observability.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
    # KV budget in bytes; None: 1 GiB on CPU, 90 % of the free GPU memory after loading on CUDA.
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks: int = 0  # decided by the worker once the model is loaded


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    policy: Literal["fcfs", "priority"] = "fcfs"
    enable_chunked_prefill: bool = True


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


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


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device: torch.device
    attention_backend: str | None = None
    observability_config: ObservabilityConfig = field(default_factory=ObservabilityConfig)


def resolve_device(device: str | torch.device) -> torch.device:
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


@dataclass
class EngineArgs:
    """Every user-facing engine option, with vLLM's names and defaults where they apply."""

    model: str | None = None
    served_model_name: str | list[str] | None = None  # default: the model as given (bundled: its name)
    dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    tensor_parallel_size: int = 1
    seed: int = 0
    device: str = "auto"
    attention_backend: str | None = None
    trace_out: str | None = None
    otlp_traces_endpoint: str | None = None
    trace_level: str = "step"
    trace_include_text: bool = False

    def create_engine_config(self) -> VllmConfig:
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
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}.")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}.")
        max_num_batched_tokens = self.max_num_batched_tokens or max(8192, self.max_num_seqs)
        if max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens must be >= max_num_seqs ({self.max_num_seqs}), "
                f"got {max_num_batched_tokens}."
            )
        if not self.enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(
                "With chunked prefill off, max_num_batched_tokens must be >= max_model_len "
                f"({max_model_len}), got {max_num_batched_tokens}."
            )
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}.")
        if self.trace_level not in ("request", "step"):
            raise ValueError(f"trace_level must be 'request' or 'step', got {self.trace_level!r}.")
        if self.tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size must be 1 for now (tensor parallelism is not built yet).")

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
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                policy=self.scheduling_policy,  # type: ignore[arg-type]
                enable_chunked_prefill=self.enable_chunked_prefill,
            ),
            parallel_config=ParallelConfig(self.tensor_parallel_size),
            device=device,
            attention_backend=self.attention_backend,
            observability_config=ObservabilityConfig(
                self.trace_out, self.otlp_traces_endpoint, self.trace_level, self.trace_include_text  # type: ignore[arg-type]
            ),
        )
