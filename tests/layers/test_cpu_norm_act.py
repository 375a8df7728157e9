"""Optimisation "cpu_norm_act" (layers/cpu_norm_act.py): the C++ element-wise chains against the plain
PyTorch code they replace. In bf16 they round where the plain code rounds, so the bits are the same;
in float16 and float32 only the order of the RMS sum (and exp's last bit) differs."""

from __future__ import annotations

import pytest
import torch

from tracevllm.layers import cpu_norm_act
from tracevllm.layers.activation import silu_and_mul
from tracevllm.layers.layernorm import rms_norm
from tracevllm.layers.rotary_embedding import rotate

pytestmark = pytest.mark.skipif(not cpu_norm_act.load(), reason="the C++ ops could not be built here")

# Row widths that end inside a vector and batch sizes of one row, a few, and enough for several threads.
SHAPES = [(1, 576), (7, 40), (130, 576)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def randn(*shape, dtype, scale=1.0, seed=0):
    generator = torch.Generator().manual_seed(seed + sum(shape))
    return (torch.randn(*shape, generator=generator) * scale).to(dtype)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if expected.dtype == torch.bfloat16:
        assert torch.equal(actual, expected)
    else:  # one unit in the last place, where a float32 sum was added in another order
        torch.testing.assert_close(actual, expected, rtol=2e-3 if expected.dtype == torch.float16 else 1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm(dtype, shape):
    x, residual = randn(*shape, dtype=dtype, scale=3), randn(*shape, dtype=dtype, seed=1)
    weight = randn(shape[1], dtype=dtype, seed=2)
    assert_matches(cpu_norm_act.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5))
    out, total = cpu_norm_act.rms_norm(x, weight, 1e-5, residual)
    expected_out, expected_total = rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(total, expected_total)  # one rounded add: always the same
    assert_matches(out, expected_out)


def test_rms_norm_per_head_and_mixed_dtypes():
    x = randn(5, 9, 64, dtype=torch.bfloat16)  # Qwen3's q_norm: [tokens, heads, head_dim]
    weight = randn(64, dtype=torch.bfloat16, seed=3)
    assert torch.equal(cpu_norm_act.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6))
    weight32 = weight.float()  # the plain code promotes; so does the op's fallback
    assert torch.equal(cpu_norm_act.rms_norm(x, weight32, 1e-6), rms_norm(x, weight32, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_and_mul(dtype, shape):
    x = randn(shape[0], 2 * shape[1], dtype=dtype, scale=4)
    assert_matches(cpu_norm_act.silu_and_mul(x), silu_and_mul(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,head_dim", [(1, 64), (7, 16), (130, 32)])
def test_rotate_strided_q_and_k(dtype, tokens, head_dim):
    qkv = randn(tokens, 12 * head_dim + 3 * head_dim, dtype=dtype)  # q, k, v side by side, as projected
    q, k = qkv[:, :9 * head_dim], qkv[:, 9 * head_dim:12 * head_dim]
    cos = randn(tokens, 1, head_dim, dtype=dtype, seed=4)
    sin = randn(tokens, 1, head_dim, dtype=dtype, seed=5)
    for actual, expected in zip(cpu_norm_act.rotate(q, k, cos, sin, head_dim), rotate(q, k, cos, sin, head_dim)):
        assert torch.equal(actual, expected)  # no sum in it: every dtype rounds alike
