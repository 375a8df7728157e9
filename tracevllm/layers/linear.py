"""Tensor-parallel linear layers.

``ColumnParallelLinear`` splits the output features across ranks (each rank computes a slice);
``RowParallelLinear`` splits the input features and sums the partial results with an all-reduce.
A column-parallel layer followed by a row-parallel one (attention's qkv -> o, the MLP's gate_up ->
down) needs one all-reduce per pair, and the activation between them stays split.

The fused variants stack several checkpoint matrices in one parameter, rank-local rows::

    QKVParallelLinear            [ q heads of this rank | k heads | v heads ]   (shard ids "q", "k", "v")
    MergedColumnParallelLinear   [ gate slice | up slice ]                      (shard ids 0, 1)

Every parameter carries ``weight_loader(param, loaded_weight, loaded_shard_id=None)``: it takes the
full checkpoint tensor, narrows it to this rank's slice and copies it into the right rows.

How a layer multiplies is a separate object, its ``linear_method`` (vLLM's linear-method idea): the
plain ``UnquantizedLinearMethod`` here calls ``F.linear``; faster methods for a CPU
(``layers/cpu_gemm.py``) are swapped in after loading, and the layers do not know them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from tracevllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)


class LinearMethodBase(ABC):
    """How a linear layer multiplies: ``apply(layer, x, bias)`` is ``x W^T + b``, computed from whatever
    form of the weight the method keeps on ``layer``.

    Every linear layer (and the LM head) holds one, ``layer.linear_method`` (vLLM names the attribute
    ``quant_method``, since most of its methods are quantisation schemes). The layers are built with the
    plain one; another method is swapped in after the weights are loaded: it first prepares, once,
    the weights it multiplies by (``process_weights_after_loading``), then serves every call. So a
    layer's ``forward`` says what is multiplied and the method says how; ``print(model)`` names each
    layer's method.
    """

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Prepare ``layer``'s weights for this method (the plain one multiplies them as loaded)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethodBase):
    """The plain GEMM: ``F.linear`` on the weight as loaded (vLLM's name: the weights are not quantised)."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


def divide(numerator: int, denominator: int) -> int:
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` (converting the dtype), refusing a checkpoint tensor of the wrong shape."""
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src)


class LinearBase(nn.Module):
    """A weight ``[output_size, input_size]`` (and bias ``[output_size]``) of this rank's sizes, and
    the ``linear_method`` that multiplies by it."""

    def __init__(self, input_size: int, output_size: int, bias: bool) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_size, self.output_size = input_size, output_size
        self.linear_method: LinearMethodBase = UnquantizedLinearMethod()
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: str | int | None = None) -> None:
        copy_checked(param.data, loaded_weight)  # replicated: every rank holds the whole tensor

    def extra_repr(self) -> str:
        return (f"input_size={self.input_size}, output_size={self.output_size}, bias={self.bias is not None}, "
                f"linear_method={type(self.linear_method).__name__}")


class ReplicatedLinear(LinearBase):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(self, x, self.bias)


class ColumnParallelLinear(LinearBase):
    """``y = x W^T + b`` with W's rows (output features) split: this rank computes ``y[..., slice]``;
    ``gather_output`` all-gathers the full ``y``."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False) -> None:
        super().__init__(input_size, divide(output_size, get_tensor_model_parallel_world_size()), bias)
        self.gather_output = gather_output

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: str | int | None = None) -> None:
        size = param.shape[0]  # weight and bias are both split along their first dim
        copy_checked(param.data, loaded_weight.narrow(0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_method.apply(self, x, self.bias)
        return tensor_model_parallel_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices stacked (the MLP's gate and up projections); checkpoint
    matrix ``i`` loads with ``loaded_shard_id=i``."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        self.shard_ids = tuple(range(len(output_sizes)))
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: int | None = None) -> None:
        assert loaded_shard_id in self.shard_ids, f"shard id must be one of {self.shard_ids}"
        offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        size = self.output_sizes[loaded_shard_id] // self.tp_size
        copy_checked(param.data.narrow(0, offset, size), loaded_weight.narrow(0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """The q, k and v projections in one matrix, split by heads.

    Each rank holds ``num_heads / tp`` query heads. KV heads are split the same way while there are
    at least as many as ranks; with fewer, each rank holds one KV head, shared by ``tp / num_kv_heads``
    consecutive ranks (rank ``r`` holds KV head ``r // num_kv_replicas``).
    """

    shard_ids = ("q", "k", "v")

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp_size)  # per rank
        if tp_size >= num_kv_heads:
            self.num_kv_heads, self.num_kv_replicas = 1, divide(tp_size, num_kv_heads)
        else:
            self.num_kv_heads, self.num_kv_replicas = divide(num_kv_heads, tp_size), 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_dim
        super().__init__(hidden_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: str | None = None) -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        kv_rank = self.tp_rank // self.num_kv_replicas
        offset, size, shard_rank = {
            "q": (0, q_size, self.tp_rank),
            "k": (q_size, kv_size, kv_rank),
            "v": (q_size + kv_size, kv_size, kv_rank),
        }[loaded_shard_id]
        copy_checked(param.data.narrow(0, offset, size), loaded_weight.narrow(0, shard_rank * size, size))


class RowParallelLinear(LinearBase):
    """``y = x W^T + b`` with W's columns (input features) split: this rank multiplies its slice of
    ``x`` (as a column-parallel layer left it) and the partial sums are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True) -> None:
        super().__init__(divide(input_size, get_tensor_model_parallel_world_size()), output_size, bias)
        self.reduce_results = reduce_results

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: str | int | None = None) -> None:
        if param.dim() == 2:
            size = param.shape[1]
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * size, size)
        copy_checked(param.data, loaded_weight)  # the bias is whole on every rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Only rank 0 adds the bias, so that it counts once in the sum rather than tp_size times.
        y = self.linear_method.apply(self, x, self.bias if self.tp_rank == 0 else None)
        return tensor_model_parallel_all_reduce(y) if self.reduce_results else y
