"""RMSNorm, with vLLM's fused residual add."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Computed in float32 and cast back before the weight, exactly as Hugging Face does.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``; or, given ``residual``, ``(norm(x + residual), x + residual)``: the residual
        stream is added in the same call, so each decoder layer carries it without extra ops."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
