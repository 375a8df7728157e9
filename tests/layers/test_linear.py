"""Tensor-parallel linear layers, checked rank by rank in one process.

For each rank the test sets the parallel state to (rank, tp), builds the layer, loads the full
checkpoint tensors through its weight loaders and runs it with the collectives switched off; it
then performs the collective itself (concatenate column slices, sum row partials) and compares
with plain ``x @ W.T + b`` on the unsplit weights.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tracevllm.layers.activation import SiluAndMul
from tracevllm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)

HIDDEN, HEAD_DIM = 32, 8


def _load(layer, tensors: dict) -> None:
    """``tensors``: {(parameter name, shard id): full checkpoint tensor}."""
    for (name, shard_id), tensor in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor, shard_id)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_column_then_row_parallel_equals_unsplit(as_rank, tp):
    """An MLP-shaped pair: column-parallel (split output), then row-parallel (split input) + sum."""
    w1, b1, w2, b2 = randn(64, HIDDEN), randn(64), randn(HIDDEN, 64), randn(HIDDEN)
    x = randn(5, HIDDEN)
    partials, column_slices = [], []
    for rank in range(tp):
        as_rank(rank, tp)
        up = ColumnParallelLinear(HIDDEN, 64, bias=True)
        down = RowParallelLinear(64, HIDDEN, bias=True)
        _load(up, {("weight", None): w1, ("bias", None): b1})
        _load(down, {("weight", None): w2, ("bias", None): b2})
        h = up(x)
        assert h.shape == (5, 64 // tp)
        column_slices.append(h)
        partials.append(down(h))
    torch.testing.assert_close(torch.cat(column_slices, -1), F.linear(x, w1, b1))
    # The bias is added by rank 0 only, so the sum carries it once.
    torch.testing.assert_close(sum(partials), F.linear(F.linear(x, w1, b1), w2, b2))


@pytest.mark.parametrize("tp", [1, 2])
def test_merged_column_parallel_gate_up(as_rank, tp):
    gate, up, x = randn(48, HIDDEN, seed=1), randn(48, HIDDEN, seed=2), randn(3, HIDDEN)
    expected = F.silu(x @ gate.T) * (x @ up.T)
    outs = []
    for rank in range(tp):
        as_rank(rank, tp)
        layer = MergedColumnParallelLinear(HIDDEN, [48, 48])
        _load(layer, {("weight", 0): gate, ("weight", 1): up})
        outs.append(SiluAndMul()(layer(x)))  # each rank's [gate slice | up slice] pairs up locally
    torch.testing.assert_close(torch.cat(outs, -1), expected)


@pytest.mark.parametrize("tp, num_kv_heads", [(1, 2), (2, 2), (4, 4), (4, 2), (8, 2)])
def test_qkv_parallel_heads_and_kv_replication(as_rank, tp, num_kv_heads):
    """Rank r holds query heads [r*h, (r+1)*h); with fewer KV heads than ranks, KV head r // (tp / kv)."""
    num_heads = 8
    q_rows, kv_rows = num_heads * HEAD_DIM, num_kv_heads * HEAD_DIM
    wq, wk, wv = randn(q_rows, HIDDEN), randn(kv_rows, HIDDEN, seed=1), randn(kv_rows, HIDDEN, seed=2)
    bq, bk, bv = randn(q_rows), randn(kv_rows, seed=3), randn(kv_rows, seed=4)
    x = randn(4, HIDDEN)
    q_full, k_full, v_full = (F.linear(x, w, b).view(4, -1, HEAD_DIM) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    q_heads = num_heads // tp
    for rank in range(tp):
        as_rank(rank, tp)
        layer = QKVParallelLinear(HIDDEN, HEAD_DIM, num_heads, num_kv_heads, bias=True)
        tensors = {("weight", "q"): wq, ("weight", "k"): wk, ("weight", "v"): wv,
                   ("bias", "q"): bq, ("bias", "k"): bk, ("bias", "v"): bv}
        _load(layer, tensors)
        kv_per_rank = layer.num_kv_heads
        assert kv_per_rank == max(1, num_kv_heads // tp)
        q, k, v = layer(x).split([q_heads * HEAD_DIM, kv_per_rank * HEAD_DIM, kv_per_rank * HEAD_DIM], -1)
        kv_first = rank * kv_per_rank if tp <= num_kv_heads else rank // (tp // num_kv_heads)
        torch.testing.assert_close(q.view(4, -1, HEAD_DIM), q_full[:, rank * q_heads : (rank + 1) * q_heads])
        torch.testing.assert_close(k.view(4, -1, HEAD_DIM), k_full[:, kv_first : kv_first + kv_per_rank])
        torch.testing.assert_close(v.view(4, -1, HEAD_DIM), v_full[:, kv_first : kv_first + kv_per_rank])


def test_replicated_and_shape_errors(as_rank):
    as_rank(0, 1)
    layer = ReplicatedLinear(HIDDEN, 16, bias=True)
    w, b, x = randn(16, HIDDEN), randn(16), randn(2, HIDDEN)
    _load(layer, {("weight", None): w, ("bias", None): b})
    torch.testing.assert_close(layer(x), F.linear(x, w, b))
    assert isinstance(layer.linear_method, UnquantizedLinearMethod)  # every layer is built plain
    assert "linear_method=UnquantizedLinearMethod" in repr(layer)
    with pytest.raises(ValueError, match=r"shape \(16, 31\)"):
        layer.weight.weight_loader(layer.weight, randn(16, 31))
    column = ColumnParallelLinear(HIDDEN, 16)
    with pytest.raises(ValueError, match="expected"):
        column.weight.weight_loader(column.weight, randn(16, HIDDEN + 1))
