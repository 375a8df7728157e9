"""Optimisations "cpu_vec_gemm" and "cpu_vec_fused_mlp" (layers/cpu_vec_gemm.py): bf16 GEMMs on
AVX512-BF16 dot products, checked against the plain bf16 product (``F.linear``, then
``silu_and_mul``). They run on CPUs with AVX512-BF16; elsewhere only the packing (plain torch) is
checked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tracevllm.layers import cpu_vec_gemm
from tracevllm.layers.activation import silu_and_mul
from tracevllm.layers.cpu_gemm import set_linear_method
from tracevllm.layers.cpu_vec_gemm import CpuVecFusedMlp, CpuVecGemm, pack_gated, pack_linear
from tracevllm.layers.linear import ColumnParallelLinear, ReplicatedLinear
from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead
from tracevllm.models.llama import LlamaMLP

# The op runs on any CPU with AVX512-BF16: the engine swaps it in where there are no AMX tiles, and for
# single rows where there are (layers/single_row_vec_gemm.py).
needs_op = pytest.mark.skipif(not (torch.cpu._is_avx512_bf16_supported() and cpu_vec_gemm.load()),
                              reason="needs a CPU with AVX512-BF16 and a C++ compiler")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape))).to(torch.bfloat16)


def one_bf16_step_apart(got: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor) -> None:
    """``got`` is ``expected`` but where the two float32 sums rounded apart: by a bf16 step at most,
    beyond what float32 sums in another order may differ by (``magnitude`` is the sum of the products'
    absolute values), and in at most 1 % of the elements."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    allowed = expected.float().abs() * 2 ** -7 + magnitude * 2 ** -20
    assert ((got.float() - expected.float()).abs() <= allowed).all()
    assert (got != expected).float().mean().item() <= 0.01


def magnitude(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.float().abs() @ w.float().abs().T


def test_pack_linear_lays_out_groups_of_64_features_in_pairs():
    w = torch.arange(100 * 6, dtype=torch.float32).reshape(100, 6).to(torch.bfloat16)
    packed = pack_linear(w)
    assert packed.shape == (2, 3, 64, 2)  # 100 features padded to 128, 6 inputs in 3 pairs
    for n, k in ((0, 0), (5, 3), (63, 5), (64, 0), (99, 4)):
        assert packed[n // 64, k // 2, n % 64, k % 2] == w[n, k]
    assert (packed[1, :, 36:] == 0).all()  # the padding


def test_pack_gated_puts_each_groups_gate_then_up():
    gate, up = randn(64, 4, seed=1), randn(64, 4, seed=2)
    packed = pack_gated(gate, up)
    assert packed.shape == (2, 2, 64, 2)
    assert torch.equal(packed[1, 1, 3], gate[32 + 3, 2:4])
    assert torch.equal(packed[1, 1, 32 + 3], up[32 + 3, 2:4])


@needs_op
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (100, 64), (16, 32), (49152, 576)], ids=str)
@pytest.mark.parametrize("rows", [1, 5, 48, 65, 200])
def test_vec_linear_rounds_as_f_linear(shape, rows):
    """Any number of rows (the row blocks are 64), features not a multiple of 64 (the padding is never
    written), and a bias."""
    w, b, x = randn(*shape, seed=1), randn(shape[0], seed=2), randn(rows, shape[1], seed=3)
    packed = pack_linear(w)
    one_bf16_step_apart(cpu_vec_gemm.vec_linear(x, packed, shape[0]), F.linear(x, w), magnitude(x, w))
    one_bf16_step_apart(cpu_vec_gemm.vec_linear(x, packed, shape[0], b), F.linear(x, w, b), magnitude(x, w))


@needs_op
def test_vec_linear_takes_strided_rows_and_leading_dims():
    w, x = randn(64, 96, seed=1), randn(2, 7, 192, seed=2)
    packed = pack_linear(w)
    view = x[..., 32:128]  # rows 192 apart
    one_bf16_step_apart(cpu_vec_gemm.vec_linear(view, packed, 64), F.linear(view, w), magnitude(view, w))


@needs_op
def test_vec_linear_refuses_what_it_cannot_read():
    w, x = randn(64, 96, seed=1), randn(3, 96, seed=2)
    with pytest.raises(RuntimeError, match="packed"):
        torch.ops.tracevllm.vec_linear(x, w, 64, None)  # not packed
    with pytest.raises(RuntimeError, match="x must be bf16"):
        torch.ops.tracevllm.vec_linear(x.float(), pack_linear(w), 64, None)
    with pytest.raises(RuntimeError, match="out_features"):
        torch.ops.tracevllm.vec_linear(x, pack_linear(w), 65, None)


@needs_op
@pytest.mark.parametrize("rows", [1, 7, 130])
def test_gated_op_rounds_where_the_plain_mlp_does(rows):
    """silu(gate) * up from one pass: each projection rounded to bf16, then the SiLU, then the product,
    as ``silu_and_mul(F.linear(x, [gate | up]))`` rounds them."""
    gate, up, x = randn(1536, 576, seed=1), randn(1536, 576, seed=2), randn(rows, 576, seed=3)
    got = torch.ops.tracevllm.vec_silu_and_mul_linear(x, pack_gated(gate, up), 1536)
    projected = F.linear(x, torch.cat((gate, up)))
    expected = silu_and_mul(projected)
    # A projection that rounded apart moves the product by a step of each factor (two steps), or by
    # what float32 sums in another order may differ by, times the other factor.
    g, u = projected.float().chunk(2, dim=-1)
    allowed = (expected.float().abs() * 2 ** -6 + (F.silu(g).abs() + 1) * magnitude(x, up) * 2 ** -20
               + u.abs() * magnitude(x, gate) * 2 ** -20)
    assert ((got.float() - expected.float()).abs() <= allowed).all()
    assert (got != expected).float().mean().item() <= 0.01


@needs_op
def test_linear_method_swapped_into_layers(as_rank):
    """``CpuVecGemm`` keeps only its packed copy of a linear layer's weight; the LM head keeps its
    weight (a tied embedding shares it); the outputs are the plain method's."""
    as_rank(0, 1)
    layer = ColumnParallelLinear(128, 192, bias=True).to(torch.bfloat16)
    head = ParallelLMHead(300, 128).to(torch.bfloat16)
    plain = ReplicatedLinear(128, 192, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        for module in (layer, plain):
            module.weight.copy_(randn(192, 128, seed=4))
            module.bias.copy_(randn(192, seed=5))
        head.weight.copy_(randn(300, 128, seed=6))
    x = randn(9, 128, seed=7)
    expected_head = head.compute_logits(x)
    set_linear_method(layer, CpuVecGemm())
    set_linear_method(head, CpuVecGemm())
    assert layer.weight is None and head.weight is not None
    one_bf16_step_apart(layer(x), plain(x), magnitude(x, plain.weight))
    torch.testing.assert_close(head.compute_logits(x), expected_head, rtol=2 ** -7, atol=0)


@needs_op
def test_fused_mlp_matches_the_plain_mlp(as_rank):
    as_rank(0, 1)
    mlp = LlamaMLP(128, 96).to(torch.bfloat16)
    mlp.gate_up_proj.weight.weight_loader(mlp.gate_up_proj.weight, randn(96, 128, seed=7), 0)
    mlp.gate_up_proj.weight.weight_loader(mlp.gate_up_proj.weight, randn(96, 128, seed=8), 1)
    mlp.down_proj.weight.weight_loader(mlp.down_proj.weight, randn(128, 96, seed=9))
    assert CpuVecFusedMlp.fits(mlp) and not CpuVecFusedMlp.fits(LlamaMLP(128, 40).to(torch.bfloat16))
    x = randn(3, 5, 128, seed=10)
    expected = mlp(x)
    fused = CpuVecFusedMlp(mlp)
    assert fused.down_proj is mlp.down_proj
    step = 2 ** -6  # of the largest output: down_proj's sums cancel
    torch.testing.assert_close(fused(x), expected, rtol=step, atol=step * expected.abs().max().item())
