"""Optimisation "single_row_vec_gemm" (layers/single_row_vec_gemm.py): on a CPU with AMX tiles, one row
through cpu_vec_gemm's op, more rows through oneDNN's, each checked against the object it sends them
to (whose own tests check it against the plain product). The switch and its load-time measurement
are checked on any CPU; the products need AMX and AVX512-BF16."""

from __future__ import annotations

import pytest
import torch

import tracevllm.layers.cpu_gemm as cpu_gemm
import tracevllm.layers.single_row_vec_gemm as single_row_vec_gemm
from tracevllm.layers import cpu_vec_gemm
from tracevllm.layers.cpu_gemm import OnednnFusedMlp, OnednnGemm, set_linear_method
from tracevllm.layers.cpu_vec_gemm import CpuVecFusedMlp, pack_linear, vec_linear
from tracevllm.layers.linear import ColumnParallelLinear
from tracevllm.layers.single_row_vec_gemm import SingleRowVecFusedMlp, SingleRowVecGemm
from tracevllm.models.llama import LlamaMLP

needs_ops = pytest.mark.skipif(not (single_row_vec_gemm.applies(torch.bfloat16) and cpu_vec_gemm.load()),
                               reason="needs a CPU with AMX tiles and AVX512-BF16, and a C++ compiler")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape))).to(torch.bfloat16)


def linear(seed: int) -> ColumnParallelLinear:
    layer = ColumnParallelLinear(128, 192, bias=True).to(torch.bfloat16)
    layer.weight.weight_loader(layer.weight, randn(192, 128, seed=seed))
    layer.bias.weight_loader(layer.bias, randn(192, seed=seed + 1))
    return layer


def mlp(seed: int) -> LlamaMLP:
    module = LlamaMLP(128, 128).to(torch.bfloat16)
    module.gate_up_proj.weight.weight_loader(module.gate_up_proj.weight, randn(128, 128, seed=seed), 0)
    module.gate_up_proj.weight.weight_loader(module.gate_up_proj.weight, randn(128, 128, seed=seed + 1), 1)
    module.down_proj.weight.weight_loader(module.down_proj.weight, randn(128, 128, seed=seed + 2))
    return module


@needs_ops
def test_one_row_through_the_vec_op_more_through_onednn(as_rank):
    as_rank(0, 1)
    layer, onednn = linear(seed=3), linear(seed=3)
    packed = pack_linear(layer.weight)
    set_linear_method(layer, SingleRowVecGemm(OnednnGemm()))
    set_linear_method(onednn, OnednnGemm())
    assert layer.weight is None  # oneDNN's method dropped it, as without the switch
    with torch.inference_mode():
        row = randn(1, 1, 128, seed=5)  # one row, whatever its leading dims
        assert torch.equal(layer(row), vec_linear(row, packed, 192, layer.bias))
        rows = randn(5, 128, seed=6)
        assert torch.equal(layer(rows), onednn(rows))


@needs_ops
def test_the_mlp_sends_one_row_to_the_vec_op_more_to_onednn(as_rank):
    as_rank(0, 1)
    plain = mlp(seed=7)
    assert SingleRowVecFusedMlp.fits(plain)
    fused = SingleRowVecFusedMlp(plain, OnednnFusedMlp(plain))
    assert fused.down_proj is fused.single.down_proj is fused.large.down_proj is plain.down_proj
    single, large = CpuVecFusedMlp(plain), OnednnFusedMlp(plain)
    with torch.inference_mode():
        row, rows = randn(1, 128, seed=8), randn(3, 128, seed=9)
        assert torch.equal(fused(row), single(row))
        assert torch.equal(fused(rows), large(rows))


def test_measured_on_takes_the_vec_op_only_where_it_won_clearly(as_rank, monkeypatch):
    """The load-time measurement: the vec op's time against oneDNN's on one row (faked here, in
    ``measured_on``'s order: vec op, then oneDNN), used at 0.9 of oneDNN's time or less; and never where
    the second copies would take over a quarter of the memory available."""
    as_rank(0, 1)
    model = torch.nn.ModuleList([linear(seed=s) for s in range(3)])
    monkeypatch.setattr(single_row_vec_gemm, "vec_linear", lambda *args: None)
    monkeypatch.setattr(single_row_vec_gemm, "onednn_linear", lambda *args: None)
    monkeypatch.setattr(single_row_vec_gemm, "pack_for_onednn", lambda w: w)
    monkeypatch.setattr(cpu_gemm, "available_memory_bytes", lambda: 2**30)
    for vec, onednn, used in ((0.8, 1.0, True), (0.95, 1.0, False), (1.2, 1.0, False)):
        times = iter((vec, onednn))
        monkeypatch.setattr(single_row_vec_gemm, "median_seconds", lambda fn, repeats: next(times))
        assert SingleRowVecGemm.measured_on(model) is used
    copies = 2 * sum(m.weight.numel() for m in model)
    monkeypatch.setattr(cpu_gemm, "available_memory_bytes", lambda: 4 * copies - 1)
    monkeypatch.setattr(single_row_vec_gemm, "median_seconds", lambda fn, repeats: pytest.fail("measured"))
    assert SingleRowVecGemm.measured_on(model) is False
