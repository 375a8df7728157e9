"""SiluAndMul: the SwiGLU gate, on the fused gate_up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2 * d]`` (gate | up) -> ``silu(gate) * up`` of ``[..., d]``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    op = staticmethod(silu_and_mul)  # the function forward runs (an instance may hold another that computes it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)
