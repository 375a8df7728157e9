"""Optimisation "compiled_norm_act" (layers/compiled.py): a module's op runs compiled, one compilation
shared by every module that holds the same function."""

from __future__ import annotations

import torch

import tracevllm.layers.compiled as compiled_mod
from tracevllm.layers.activation import SiluAndMul, silu_and_mul
from tracevllm.layers.compiled import CompiledNormAct


def test_compiled_for_every_batch(monkeypatch):
    calls = []
    monkeypatch.setattr(compiled_mod, "compiled", lambda fn: lambda x: calls.append(len(x)) or fn(x))
    act = SiluAndMul()
    assert act.op is silu_and_mul  # built plain
    act.op = CompiledNormAct(act.op)
    for rows in (1, 200):
        x = torch.randn(rows, 8)
        assert torch.equal(act(x), silu_and_mul(x))
    assert calls == [1, 200]
