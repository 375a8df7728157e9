"""Rotary position embedding (RoPE), default and Llama 3 frequency scaling.

cos/sin are precomputed in float32 for every position up to ``max_position`` and indexed by each
token's position, so a batch mixing prefill chunks and decodes at different positions is one
gather. The rotation is the "neox" (rotate_half) form that Hugging Face's Llama/Qwen use.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def rope_parameters(hf_config) -> dict:
    """The rope settings of a config, from transformers 5 (``rope_parameters``) or older fields."""
    params = getattr(hf_config, "rope_parameters", None)
    if params:
        params = dict(params)
    else:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    return params


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, params: dict) -> None:
        super().__init__()
        self.head_dim = head_dim
        rope_type = params["rope_type"]
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_type must be 'default' or 'llama3', got {rope_type!r}.")
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (params["rope_theta"] ** exponent)
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, params)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cache", emb.cos(), persistent=False)
        self.register_buffer("sin_cache", emb.sin(), persistent=False)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` ``[T, heads * D]`` and ``k`` ``[T, kv_heads * D]`` by each token's position."""
        cos = self.cos_cache[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin_cache[positions].to(q.dtype).unsqueeze(1)
        t = q.shape[0]
        q = q.view(t, -1, self.head_dim)
        k = k.view(t, -1, self.head_dim)
        q = q * cos + self._rotate_half(q) * sin
        k = k * cos + self._rotate_half(k) * sin
        return q.reshape(t, -1), k.reshape(t, -1)


def get_rope(head_dim: int, max_position: int, hf_config) -> RotaryEmbedding:
    return RotaryEmbedding(head_dim, max_position, rope_parameters(hf_config))
