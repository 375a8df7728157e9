"""Optimisation "cpu_norm_act": RMSNorm (with its residual add), SiLU-and-mul and the RoPE rotation
on CPU as C++ ops, one pass over memory each, built once per machine.

Eagerly, ``rms_norm`` is six passes over the activations, ``silu_and_mul`` three and ``rotate`` five
per tensor, each a dispatch of its own. ``cpu_norm_act.cpp`` does each chain in one pass, rounding to
the activations' dtype where the plain code rounds, and ``apply_model_optimizations`` swaps these
functions in as the modules' ``op``. They replace torch.compile (``compiled.py``) on CPU: a compile
runs in each new process, in the first large batch, inside a user's request (5-13 s); the C++ build
runs once per machine (``attention/ops/cpu_extension.py`` caches it) and loads at start-up.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tracevllm.attention.ops import cpu_extension
from tracevllm.layers import layernorm

_SOURCE = Path(__file__).with_name("cpu_norm_act.cpp")


def load() -> bool:
    """Build (once per machine) and load the ops; False, with a warning, where they cannot be built."""
    # No fused multiply-adds where the plain code rounds a product before adding it.
    return cpu_extension.load("cpu_norm_act", ("-ffp-contract=off",), source=_SOURCE,
                              fallback="the plain element-wise code runs instead")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``layernorm.rms_norm`` in one pass: ``norm(x)``, or ``(norm(x + residual), x + residual)``."""
    if weight.dtype != x.dtype:  # the plain code promotes; the op keeps one dtype
        return layernorm.rms_norm(x, weight, eps, residual)
    rows = x.reshape(-1, x.shape[-1])  # Qwen3's q/k norms come as [tokens, heads, head_dim]
    out, total = torch.ops.tracevllm.fused_rms_norm(
        rows, weight, eps, None if residual is None else residual.reshape(rows.shape))
    return out.view(x.shape) if residual is None else (out.view(x.shape), total.view(x.shape))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``activation.silu_and_mul`` in one pass: ``[T, 2 * d]`` (gate | up) -> ``silu(gate) * up``."""
    return torch.ops.tracevllm.silu_and_mul(x)


def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary_embedding.rotate`` in one pass per tensor."""
    return torch.ops.tracevllm.rotate_neox(q, k, cos, sin, head_dim)
