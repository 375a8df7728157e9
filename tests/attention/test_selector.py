"""The attention selector: the backend by name, and "auto"'s choice on a CPU."""

from __future__ import annotations

import pytest
import torch

from tracevllm.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionImpl
from tracevllm.attention.backends.torch_attn import TorchAttentionBackend, TorchAttentionImpl
from tracevllm.attention.selector import get_attn_backend
from tracevllm.optimizations import DISABLE_ENV, OptimizationConfig

CPU = torch.device("cpu")


def test_by_name(monkeypatch):
    assert get_attn_backend("torch", CPU) is TorchAttentionBackend
    assert TorchAttentionBackend.get_impl_cls() is TorchAttentionImpl
    assert get_attn_backend("cpu", CPU) is CPUAttentionBackend
    assert CPUAttentionBackend.get_impl_cls() is CPUAttentionImpl
    with pytest.raises(ValueError, match="attention_backend must be one of .*'triton'.*got 'flash'"):
        get_attn_backend("flash", CPU)
    with pytest.raises(ValueError, match="'cpu' runs on a CPU"):
        get_attn_backend("cpu", torch.device("cuda"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        get_attn_backend("triton", CPU)


def test_auto_on_cpu(monkeypatch):
    """The cpu backend while any of its optimisations is on; the plain torch backend with all of them off
    (whatever the others), so that TRACEVLLM_DISABLE_OPTIMIZATIONS=all runs the plain path."""
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    assert get_attn_backend(None, CPU) is CPUAttentionBackend
    assert get_attn_backend("auto", CPU, OptimizationConfig.from_names(["all"])) is TorchAttentionBackend
    its_own = list(CPUAttentionBackend.optimizations)
    assert get_attn_backend("auto", CPU, OptimizationConfig.from_names(its_own)) is TorchAttentionBackend
    assert get_attn_backend("auto", CPU, OptimizationConfig.from_names(its_own[1:])) is CPUAttentionBackend
    monkeypatch.setenv(DISABLE_ENV, "all")  # no config given: the environment's
    assert get_attn_backend(None, CPU) is TorchAttentionBackend
