"""Tensor-parallel linear layers.

``ColumnParallelLinear`` splits the output features across ranks (each rank computes a slice);
``RowParallelLinear`` splits the input features and sums the partial results with an all-reduce.
A column-parallel layer followed by a row-parallel one (attention's qkv -> o, the MLP's gate_up ->
down) needs one all-reduce per pair. The fused variants (``QKVParallelLinear``,
``MergedColumnParallelLinear``) stack several checkpoint matrices in one parameter; each parameter's
``weight_loader`` copies a checkpoint tensor's shard for this rank into the right rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tracevllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)


def _cpu_has_native(dtype: torch.dtype) -> bool:
    cpu = getattr(torch, "cpu", None)
    if dtype == torch.bfloat16:
        return bool(cpu and (cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()))
    return bool(cpu and cpu._is_amx_fp16_supported())


_CPU_NATIVE_HALF = {dtype: _cpu_has_native(dtype) for dtype in (torch.bfloat16, torch.float16)}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, except for bf16/fp16 on a CPU without instructions for them (e.g. AVX2 only).

    There torch emulates the half-precision GEMM about 5x slower than float32. Multiplying the same
    half-precision values in float32 and rounding the result back is what a native bf16 GEMM does
    (the products are exact in float32, the sums accumulate in float32), so it is used instead.
    """
    if x.device.type == "cpu" and x.dtype in _CPU_NATIVE_HALF and not _CPU_NATIVE_HALF[x.dtype]:
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    return F.linear(x, weight, bias)


def _divide(a: int, b: int) -> int:
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_dim = tp_dim  # which dim of the weight is split across ranks (None: replicated)
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        dim = self.tp_dim if self.tp_dim is not None and self.tp_dim < loaded_weight.dim() else None
        if dim is not None:
            size = param.shape[dim]
            loaded_weight = loaded_weight.narrow(dim, self.tp_rank * size, size)
        assert param.shape == loaded_weight.shape, f"{tuple(param.shape)} != {tuple(loaded_weight.shape)}"
        param.data.copy_(loaded_weight)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias, tp_dim=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        super().__init__(input_size, _divide(output_size, tp_size), bias, tp_dim=0)
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.bias)
        return tensor_model_parallel_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices stacked (the MLP's gate and up projections)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int | None = None) -> None:
        assert shard_id is not None, "a merged layer loads one matrix at a time"
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        loaded_weight = loaded_weight.narrow(0, self.tp_rank * size, size)
        param.data.narrow(0, offset, size).copy_(loaded_weight)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matrix: rows ``[q heads | k heads | v heads]`` of this rank.

    With fewer KV heads than ranks, each KV head is replicated on ``tp_size / num_kv_heads`` ranks.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp_size)
        if tp_size >= num_kv_heads:
            self.num_kv_heads, self.num_kv_replicas = 1, _divide(tp_size, num_kv_heads)
        else:
            self.num_kv_heads, self.num_kv_replicas = _divide(num_kv_heads, tp_size), 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_dim
        super().__init__(hidden_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | None = None) -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        offset, size, shard_rank = {
            "q": (0, q_size, self.tp_rank),
            "k": (q_size, kv_size, self.tp_rank // self.num_kv_replicas),
            "v": (q_size + kv_size, kv_size, self.tp_rank // self.num_kv_replicas),
        }[shard_id]
        loaded_weight = loaded_weight.narrow(0, shard_rank * size, size)
        param.data.narrow(0, offset, size).copy_(loaded_weight)


class RowParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        super().__init__(_divide(input_size, tp_size), output_size, bias, tp_dim=1)
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added once, after the partial products are summed.
        y = linear(x, self.weight)
        if self.reduce_results:
            y = tensor_model_parallel_all_reduce(y)
        return y + self.bias if self.bias is not None else y
