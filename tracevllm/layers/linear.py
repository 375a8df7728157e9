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
from tracevllm.layers.float32_gemm import float32_linear, pack_float32


def cpu_lacks_half_gemm(dtype: torch.dtype) -> bool:
    """True for bf16/fp16 on a CPU without instructions for them (e.g. AVX2 only), where torch
    emulates a half-precision GEMM about 5x slower than float32."""
    cpu = getattr(torch, "cpu", None)
    if dtype == torch.bfloat16:
        return not (cpu and (cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()))
    return dtype == torch.float16 and not (cpu and cpu._is_amx_fp16_supported())


def cpu_has_onednn_gemm(dtype: torch.dtype) -> bool:
    """True for bf16/fp16 on a CPU with instructions for them: oneDNN then runs the GEMM natively."""
    return dtype in (torch.bfloat16, torch.float16) and not cpu_lacks_half_gemm(dtype)


# The batch size oneDNN packs a weight for. It picks the blocked layout from this hint: a hint of 1 picks
# one that measured slower on this project's 2-core Xeon (bf16, 30 SmolLM2 layers whose weights stream
# from memory, as in a forward): 17.6 against 14.2-14.6 ms at 48 rows, 27.9 against 23.2-23.9 at 128,
# 907 against 761-766 at 8,192, level at 1-16 rows, and faster only at 512-1,024 (63 against 65-70, 107
# against 133-136). Every hint from 16 to 4,096 gave the same times. With this layout the GEMM also
# rounds as F.linear does, bit for bit on 2 threads (tests/layers/test_linear.py); with hint 1 it did not at
# 48 rows. On a 16-core Xeon with torch 2.11 it differed by one bf16 step at 48 and 200 rows.
ONEDNN_PACK_BATCH_HINT = 64


def pack_for_onednn(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` reordered once into oneDNN's blocked layout for ``_linear_pointwise``."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ONEDNN_PACK_BATCH_HINT)


def prepack_onednn(module: nn.Module, float32_min_rows: int | None = None) -> None:
    """Give ``module`` (a linear layer or the LM head) ``packed_weight``: its weight reordered once
    into oneDNN's blocked layout (optimisation ``onednn_gemm``), which ``apply_linear`` then uses.
    With ``float32_min_rows`` (optimisation ``cpu_float32_gemm``, float32_gemm.py), also a float32
    packed copy for batches of at least that many rows.
    Measured on this project's 2-core Xeon, bf16: a SmolLM2 forward's GEMMs at one token took 12.8 ms
    instead of 21.2 ms (the packed layout streams through the cache; ``F.linear`` re-blocks the plain
    one on every call). A linear layer's plain weight is dropped, as vLLM's CPU backend does, so the
    model is not held twice; the LM head keeps its weight, which a tied embedding shares."""
    module.packed_weight = pack_for_onednn(module.weight)
    if float32_min_rows is not None:
        module.packed_weight_float32, module.float32_min_rows = pack_float32(module.weight), float32_min_rows
    if isinstance(module, LinearBase):
        module.weight = None


def apply_linear(module: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` with ``module``'s weight: on its oneDNN-packed copy when it has one, or on its
    float32 packed copy when it has one and ``x`` has at least ``float32_min_rows`` rows."""
    packed = getattr(module, "packed_weight", None)
    if packed is not None:
        packed_float32 = getattr(module, "packed_weight_float32", None)
        if packed_float32 is not None and x.numel() >= module.float32_min_rows * x.shape[-1]:
            return float32_linear(x, packed_float32, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return linear(x, module.weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, returning ``x``'s dtype.

    A weight may be stored in float32 under half-precision activations (``store_weights_in_float32``,
    for CPUs without half-precision GEMMs). Then ``x`` is multiplied in float32 and the result rounded
    back once, which is what a native bf16 GEMM does: the products of half-precision values are exact
    in float32, and the sums accumulate in float32.
    """
    if weight.dtype != x.dtype:
        return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)
    return F.linear(x, weight, bias)


def store_weights_in_float32(module: nn.Module) -> None:
    """Replace ``module``'s own parameters (a GEMM's weight and bias) by float32 copies of their
    half-precision values: the same numbers, twice the memory, and no conversion of the whole weight
    on every call (which would cost a decode step as much as the GEMM itself). A weight tied to
    another module (an LM head sharing the embedding) is untied: the other module keeps its own."""
    for name, param in list(module.named_parameters(recurse=False)):
        setattr(module, name, nn.Parameter(param.data.float(), requires_grad=False))


def divide(numerator: int, denominator: int) -> int:
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` (converting the dtype), refusing a checkpoint tensor of the wrong shape."""
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src)


class LinearBase(nn.Module):
    """A weight ``[output_size, input_size]`` (and bias ``[output_size]``) of this rank's sizes."""

    def __init__(self, input_size: int, output_size: int, bias: bool) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
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


class ReplicatedLinear(LinearBase):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_linear(self, x, self.bias)


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
        y = apply_linear(self, x, self.bias)
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

    # Optimisation "onednn_fused_mlp": the gate and up halves, each packed for oneDNN (prepack_gate_up).
    packed_gate_up: tuple[torch.Tensor, torch.Tensor] | None = None
    # Optimisation "cpu_float32_gemm": the same two, float32, for batches of at least float32_min_rows rows.
    packed_gate_up_float32: tuple[torch.Tensor, torch.Tensor] | None = None

    def prepack_gate_up(self, float32_min_rows: int | None = None) -> None:
        """Pack the gate and the up matrix (this rank's halves of ``[gate | up]``) separately for
        ``silu_and_mul``, and drop the plain weight. Only for the bias-free two-matrix MLP layer.
        With ``float32_min_rows``, also float32 packed copies of both (float32_gemm.py)."""
        assert len(self.output_sizes) == 2 and self.bias is None
        gate, up = self.weight.detach().chunk(2)
        self.packed_gate_up = (pack_for_onednn(gate), pack_for_onednn(up))
        if float32_min_rows is not None:
            self.packed_gate_up_float32 = (pack_float32(gate), pack_float32(up))
            self.float32_min_rows = float32_min_rows
        self.weight = None

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(x W_gate^T) * (x W_up^T)``, in two oneDNN GEMMs whose epilogues apply the SiLU and the
        product, so that neither the ``[T, 2I]`` projection nor the gate is written and read again.
        Measured on this project's 2-core Xeon (bf16, SmolLM2's 576 -> 2 x 1536): 7.1 ms instead of
        10.0 ms at 4,096 rows, 0.114 against 0.131 ms at 32, but 0.090 against 0.077 ms at one row.
        The SiLU's result is not rounded to bf16 before the product, as the eager code rounds it:
        values differ from the plain path's by up to one bf16 step."""
        assert self.packed_gate_up is not None
        gate_w, up_w = self.packed_gate_up
        float32 = self.packed_gate_up_float32 is not None and x.numel() >= self.float32_min_rows * x.shape[-1]
        if float32:  # optimisation "cpu_float32_gemm": the same two GEMMs in float32, rounded once at the end
            (gate_w, up_w), x_in = self.packed_gate_up_float32, x.float()
        else:
            x_in = x
        gate = torch.ops.mkldnn._linear_pointwise(x_in, gate_w, None, "swish", [], "")
        out = torch.ops.mkldnn._linear_pointwise.binary(x_in, gate, up_w, None, "mul")
        return out.to(x.dtype) if float32 else out


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
        y = apply_linear(self, x, self.bias if self.tp_rank == 0 else None)
        return tensor_model_parallel_all_reduce(y) if self.reduce_results else y
