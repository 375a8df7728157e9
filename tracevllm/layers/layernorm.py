"""RMSNorm, with vLLM's fused residual add."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``norm(x)``; or, given ``residual``, ``(norm(x + residual), x + residual)``. Computed in float32
    and cast back before the weight, exactly as Hugging Face does."""
    if residual is not None:
        x = x + residual
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * x32.to(x.dtype)
    return out if residual is None else (out, x)


class RMSNorm(nn.Module):
    op = staticmethod(rms_norm)  # the function forward runs (an instance may hold another that computes it)

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; or, given ``residual``, ``(norm(x + residual), x + residual)``: the residual
        stream is added in the same call, so each decoder layer carries it without extra ops."""
        return self.op(x, self.weight, self.eps, residual)
