"""Rotary position embedding (RoPE): default and Llama 3 frequency scaling.

cos/sin are precomputed in float32 for every position below ``max_position`` and indexed by each
token's position, so a batch mixing prefill chunks and decodes at different positions is one
gather. The rotation is the "neox" form (rotate_half) that Hugging Face's Llama and Qwen use: the
head's first half pairs with its second half, ``x' = x * cos + rotate_half(x) * sin`` with
``rotate_half([a, b]) = [-b, a]``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_SUPPORTED_ROPE_TYPES = ("default", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def get_rope_parameters(hf_config) -> dict:
    """The rope settings of a config as one dict with ``rope_type`` and ``rope_theta``: from
    ``config.rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (older)."""
    params = getattr(hf_config, "rope_parameters", None)
    params = dict(params or getattr(hf_config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0)
    # Old configs name the type "type"; some spell default as None.
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1's rescaling: wavelengths longer than ``old_len / low_freq_factor`` are stretched by
    ``factor``, shorter than ``old_len / high_freq_factor`` kept, and those between interpolated."""
    missing = [key for key in _LLAMA3_KEYS if key not in params]
    if missing:
        raise ValueError(f"rope_parameters of rope_type 'llama3' must set {list(_LLAMA3_KEYS)}; missing {missing}.")
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x * cos + rotate_half(x) * sin`` for q and k, each ``[T, n * head_dim]``; cos, sin ``[T, 1, head_dim]``."""
    t = q.shape[0]
    q = q.view(t, -1, head_dim)
    k = k.view(t, -1, head_dim)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q.reshape(t, -1), k.reshape(t, -1)


class RotaryEmbedding(nn.Module):
    op = staticmethod(rotate)  # the function forward runs (an instance may hold another that computes it)

    def __init__(self, head_dim: int, max_position: int, rope_parameters: dict) -> None:
        super().__init__()
        rope_type = rope_parameters.get("rope_type", "default")
        if rope_type not in _SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {list(_SUPPORTED_ROPE_TYPES)}, got {rope_type!r}.")
        if rope_parameters.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"partial_rotary_factor must be 1.0, got {rope_parameters['partial_rotary_factor']}.")
        self.head_dim = head_dim
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (rope_parameters["rope_theta"] ** exponent)
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, rope_parameters)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_position, head_dim]
        self.register_buffer("cos_cache", emb.cos(), persistent=False)
        self.register_buffer("sin_cache", emb.sin(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, 1, D]`` at ``positions``, in ``dtype``."""
        # Cast to the activations' dtype before multiplying, as Hugging Face does.
        cos = self.cos_cache[positions].to(dtype).unsqueeze(1)
        sin = self.sin_cache[positions].to(dtype).unsqueeze(1)
        return cos, sin

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` ``[T, heads * D]`` and ``k`` ``[T, kv_heads * D]`` by each token's position."""
        return self.op(q, k, *self.cos_sin(positions, q.dtype), self.head_dim)


def get_rope(head_dim: int, max_position: int, rope_parameters: dict) -> RotaryEmbedding:
    """A RoPE for ``positions < max_position``; ``rope_parameters`` as ``get_rope_parameters`` gives.
    ValueError for a rope type other than default or llama3."""
    return RotaryEmbedding(head_dim, max_position, rope_parameters)
