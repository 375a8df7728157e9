"""RMSNorm (with and without the fused residual add) against transformers' LlamaRMSNorm."""

from __future__ import annotations

import pytest
import torch

from tracevllm.layers.layernorm import RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)
    weight = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    x = (3 * torch.randn(7, 96, generator=g)).to(dtype)
    residual = torch.randn(7, 96, generator=g).to(dtype)
    hf = LlamaRMSNorm(96, eps=1e-5).to(dtype)
    ours = RMSNorm(96, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(weight)
        ours.weight.copy_(weight)

        assert torch.equal(ours(x), hf(x))
        normed, new_residual = ours(x, residual)
        # A decoder layer's "hidden = residual + hidden; norm(hidden)", in the activations' dtype.
        assert torch.equal(new_residual, residual + x)
        assert torch.equal(normed, hf(residual + x))
        assert normed.dtype == new_residual.dtype == dtype
