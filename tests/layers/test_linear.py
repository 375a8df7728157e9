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

import tracevllm.layers.linear as linear_mod
from tracevllm.layers.activation import SiluAndMul
from tracevllm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
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
    with pytest.raises(ValueError, match=r"shape \(16, 31\)"):
        layer.weight.weight_loader(layer.weight, randn(16, 31))
    column = ColumnParallelLinear(HIDDEN, 16)
    with pytest.raises(ValueError, match="expected"):
        column.weight.weight_loader(column.weight, randn(16, HIDDEN + 1))


@pytest.mark.parametrize("stored_in_float32", [False, True], ids=["half-weight", "float32-weight"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_linear_matches_a_float32_accumulating_gemm(as_rank, dtype, stored_in_float32):
    """A half-precision layer gives what a GEMM with float32 accumulation gives, rounded once,
    whether its weights are half or float32 copies of the same values."""
    as_rank(0, 1)
    x, w, b = randn(6, 256).to(dtype), randn(40, 256, seed=1).to(dtype), randn(40, seed=2).to(dtype)
    layer = ColumnParallelLinear(256, 40, bias=True).to(dtype)
    layer.weight.weight_loader(layer.weight, w)
    layer.bias.weight_loader(layer.bias, b)
    if stored_in_float32:
        linear_mod.store_weights_in_float32(layer)
        assert layer.weight.dtype == layer.bias.dtype == torch.float32
        assert torch.equal(layer.weight, w.float())
    expected = (x.double() @ w.double().T + b.double()).to(dtype)
    y = layer(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y, expected, atol=1e-4, rtol=2 ** -7)


def test_float32_storage_unties_a_shared_weight(as_rank):
    as_rank(0, 1)
    first = ReplicatedLinear(8, 4, bias=False).to(torch.bfloat16)
    second = ReplicatedLinear(8, 4, bias=False).to(torch.bfloat16)
    second.weight = first.weight
    linear_mod.store_weights_in_float32(second)
    assert first.weight.dtype == torch.bfloat16 and second.weight.dtype == torch.float32
    assert torch.equal(first.weight.float(), second.weight)


@pytest.mark.skipif(not linear_mod.cpu_has_onednn_gemm(torch.bfloat16), reason="needs a CPU with bf16 instructions")
@pytest.mark.parametrize("rows", [1, 3, 48, 200])
def test_onednn_packed_gemm_rounds_as_f_linear(as_rank, rows):
    """Optimisation "onednn_gemm": the weight packed for oneDNN gives F.linear's bf16 result, bit for
    bit on this project's 2-core machines (a weight packed for a batch of 1 did not there: it sums in
    another order at 48 and 200 rows). On a 16-core Xeon with AMX and torch 2.11 (the GPU machine's
    host) 48 and 200 rows differed from F.linear by one bf16 step: more threads or that torch's oneDNN,
    not told apart. So the check is exact on up to 2 threads and within one bf16 step beyond."""
    as_rank(0, 1)
    w = randn(576, 1536, seed=3).to(torch.bfloat16)
    layer = RowParallelLinear(1536, 576, bias=False).to(torch.bfloat16)
    layer.weight.weight_loader(layer.weight, w)
    linear_mod.prepack_onednn(layer)
    assert layer.weight is None
    x = randn(rows, 1536, seed=4).to(torch.bfloat16)
    if torch.get_num_threads() <= 2:
        assert torch.equal(layer(x), F.linear(x, w))
    else:
        torch.testing.assert_close(layer(x), F.linear(x, w), rtol=2 ** -7, atol=1e-3)


@pytest.mark.skipif(not linear_mod.cpu_has_onednn_gemm(torch.bfloat16), reason="needs a CPU with bf16 instructions")
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_float32_copy_serves_batches_from_its_row_count(as_rank, monkeypatch, bias):
    """Optimisation "cpu_float32_gemm": batches of at least ``float32_min_rows`` rows go through the
    float32 packed copy and give what a float32-accumulating GEMM gives, rounded once; smaller ones
    keep the bf16 packed GEMM, bit for bit F.linear's."""
    as_rank(0, 1)
    w, b = randn(96, 256, seed=5).to(torch.bfloat16), randn(96, seed=6).to(torch.bfloat16)
    layer = ColumnParallelLinear(256, 96, bias=bias).to(torch.bfloat16)
    layer.weight.weight_loader(layer.weight, w)
    if bias:
        layer.bias.weight_loader(layer.bias, b)
    linear_mod.prepack_onednn(layer, float32_min_rows=8)
    assert layer.weight is None and layer.packed_weight_float32.dtype == torch.float32
    calls, float32_linear = [], linear_mod.float32_linear
    monkeypatch.setattr(linear_mod, "float32_linear", lambda x, *args: calls.append(len(x)) or float32_linear(x, *args))
    for rows in (1, 7, 8, 40):
        x = randn(rows, 256, seed=rows).to(torch.bfloat16)
        y = layer(x)
        if rows < 8:
            assert torch.equal(y, F.linear(x, w, b if bias else None))
        else:
            expected = (x.double() @ w.double().T + (b.double() if bias else 0)).to(torch.bfloat16)
            assert y.dtype == torch.bfloat16
            torch.testing.assert_close(y, expected, atol=1e-4, rtol=2 ** -7)
    assert calls == [8, 40]


@pytest.mark.skipif(not linear_mod.cpu_has_onednn_gemm(torch.bfloat16), reason="needs a CPU with bf16 instructions")
def test_float32_fused_mlp_matches_the_bf16_one(as_rank):
    """The fused gate/up GEMMs (onednn_fused_mlp) on their float32 copies, for a batch of at least
    ``float32_min_rows``, and on the bf16 ones below it: both within a bf16 step of the product in
    float64."""
    as_rank(0, 1)
    layer = MergedColumnParallelLinear(128, [64, 64]).to(torch.bfloat16)
    gate, up = randn(64, 128, seed=7).to(torch.bfloat16), randn(64, 128, seed=8).to(torch.bfloat16)
    layer.weight.weight_loader(layer.weight, gate, 0)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.prepack_gate_up(float32_min_rows=16)
    assert layer.packed_gate_up_float32 is not None
    for rows in (3, 16, 100):
        x = randn(rows, 128, seed=9).to(torch.bfloat16)
        g, u = x.double() @ gate.double().T, x.double() @ up.double().T
        expected = (g * torch.sigmoid(g) * u).to(torch.bfloat16)
        torch.testing.assert_close(layer.silu_and_mul(x), expected, atol=1e-3, rtol=2 ** -6)


@pytest.mark.skipif(not linear_mod.cpu_has_onednn_gemm(torch.bfloat16), reason="needs a CPU with bf16 instructions")
@pytest.mark.parametrize("slow, expected", [((), 32), ((64,), 128), ((512,), None)])
def test_float32_min_rows_is_the_end_of_a_run_of_wins(monkeypatch, slow, expected):
    """From the largest candidate down, float32 is kept while it wins by the margin; the answer is the
    last size of that run, or None. Timings faked: bf16 1 s a call, float32 0.5 s, except at the
    batch sizes in ``slow`` (1 s: no clear win)."""
    from tracevllm.layers import float32_gemm

    weights = [randn(64, 128, seed=i).to(torch.bfloat16) for i in range(2)]
    packed = [linear_mod.pack_for_onednn(w) for w in weights]
    times = iter([t for rows in float32_gemm.CANDIDATE_ROWS for t in (1.0, 1.0 if rows in slow else 0.5)])
    monkeypatch.setattr(float32_gemm, "_median_seconds", lambda fn: next(times))
    assert float32_gemm.measure_float32_min_rows(weights, packed) == expected


@pytest.mark.skipif(not linear_mod.cpu_has_onednn_gemm(torch.bfloat16), reason="needs a CPU with bf16 instructions")
def test_float32_min_rows_measured_for_real():
    from tracevllm.layers import float32_gemm

    weights = [randn(64, 128, seed=i).to(torch.bfloat16) for i in range(2)]
    packed = [linear_mod.pack_for_onednn(w) for w in weights]
    assert float32_gemm.measure_float32_min_rows(weights, packed) in (*float32_gemm.CANDIDATE_ROWS, None)
