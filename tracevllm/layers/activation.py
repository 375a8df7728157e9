"""SiluAndMul: the SwiGLU gate, on the fused gate_up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tracevllm.layers.compiled import compiled, use_compiled_for


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2 * d]`` (gate | up) -> ``silu(gate) * up`` of ``[..., d]``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    # Optimisation "compiled_norm_act": large batches run ``silu_and_mul`` compiled into one pass.
    use_compiled = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (compiled(silu_and_mul) if use_compiled_for(self, x) else silu_and_mul)(x)
