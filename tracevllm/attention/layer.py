"""Attention: the layer a model calls; the backend does the work on the layer's paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from tracevllm.attention.backends.abstract import AttentionBackend, AttentionMetadata


class Attention(nn.Module):
    """One layer's attention over this rank's heads. ``num_heads`` and ``num_kv_heads`` are per rank:
    ``num_heads / tp`` query heads and ``max(1, num_kv_heads / tp)`` KV heads of the model's (as
    ``QKVParallelLinear`` splits them), and the layer's KV cache holds only those KV heads."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int,
                 attn_backend: type[AttentionBackend], sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads
        self.impl = attn_backend.get_impl_cls()(num_heads, head_dim, num_kv_heads, scale, sliding_window)
        # (key_cache, value_cache), bound by the model runner once the KV cache is allocated.
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """q ``[T, num_heads * head_dim]``, k and v ``[T, num_kv_heads * head_dim]`` -> ``[T, num_heads * head_dim]``."""
        assert self.kv_cache is not None, "bind_kv_cache() must run before the first forward"
        n = q.shape[0]
        out = self.impl.forward(
            q.view(n, self.num_heads, self.head_dim),
            k.view(n, self.num_kv_heads, self.head_dim),
            v.view(n, self.num_kv_heads, self.head_dim),
            self.kv_cache,
            attn_metadata,
        )
        return out.reshape(n, self.num_heads * self.head_dim)


def bind_kv_cache(model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Give the i-th Attention layer of ``model`` (in module order) the i-th cache pair."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    assert len(layers) == len(kv_caches), f"{len(layers)} attention layers, {len(kv_caches)} caches"
    for layer, kv_cache in zip(layers, kv_caches):
        layer.kv_cache = kv_cache
