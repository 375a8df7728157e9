"""The attention-backend interface and the metadata every backend shares.

KV cache layout (the same for all backends), one pair of tensors per layer::

    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A token at position ``p`` of a request whose block table is ``bt`` lives in physical block
``bt[p // block_size]`` at offset ``p % block_size``; its *slot* is
``bt[p // block_size] * block_size + p % block_size``, and ``slot_mapping`` gives that slot for every
token of the step (-1 for padding, which is never written).

The step's tokens are flattened: request ``i`` owns query rows
``query_start_loc[i]:query_start_loc[i + 1]``; these are the last ``query_len`` tokens of its
sequence of ``seq_lens[i]`` tokens, so the first ``seq_lens[i] - query_len`` keys (its context) are
already in the cache. Decode (query_len 1), prefill and chunked prefill over a cached prefix are all
the same case.

The runner builds one ``AttentionMetadata`` per step and hands it to the backend's
``AttentionMetadataBuilder``, made once at start-up, whose ``build`` gives what every layer of the
step reads: the metadata as it is (torch, Triton), or with what the backend chose and planned (CPU).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from tracevllm.optimizations import OptimizationConfig


@dataclass(slots=True)
class AttentionMetadata:
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, on the device
    seq_lens: torch.Tensor  # [num_reqs] int32, on the device
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32, on the device
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64, on the device
    # Host copies, so that a backend can plan its work without a device-to-host sync.
    query_start_loc_cpu: np.ndarray
    seq_lens_cpu: np.ndarray

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)


class AttentionImpl(ABC):
    """Computes attention for one layer, reading and writing that layer's paged KV cache."""

    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int, scale: float,
                 sliding_window: int | None = None) -> None:
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...


class AttentionMetadataBuilder:
    """Made once at start-up, after the model is built; ``build`` turns the runner's metadata of each
    step into what the backend's layers read (vLLM: ``AttentionMetadataBuilder``, one per backend). This
    one hands it on as it is."""

    def __init__(self, impl: AttentionImpl, dtype: torch.dtype, block_size: int,
                 optimization_config: OptimizationConfig) -> None:
        """``impl``: one of the model's attention layers' (all of a model's layers have its heads)."""

    def build(self, md: AttentionMetadata) -> AttentionMetadata:
        return md

    def describe(self) -> str:
        """What the backend chose at start-up, for the start-up log and trace ("" where its name says it all)."""
        return ""


class AttentionBackend(ABC):
    name: str
    # Whether a decode step's layers can be captured in a CUDA graph (worker/cuda_graphs.py): nothing
    # per step on the host (no loop over the sequences, no host arrays read), no shape chosen per step.
    supports_cuda_graphs: bool = False

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl]: ...

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        return AttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (num_blocks, block_size, num_kv_heads, head_dim)
