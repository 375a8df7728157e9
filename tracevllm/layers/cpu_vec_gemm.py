"""Optimisations "cpu_vec_gemm" and "cpu_vec_fused_mlp": bf16 GEMMs on AVX512-BF16 dot products.

On a CPU with AVX512-BF16 but no AMX tiles (AMD Zen 4 and Zen 5), oneDNN's bf16 GEMM
(``OnednnGemm``, layers/cpu_gemm.py) pays a fixed cost on every call before it multiplies, and
measured slower at every batch size than one loop of ``vdpbf16ps`` over weights packed in the
instruction's own layout (docs/perf-log.md#avx512-bf16-gemms). So here:

- ``CpuVecGemm``, a linear method: each weight packed once, at load (``pack_linear``), into groups
  of 64 output features, each group VNNI-packed (``[in / 2][64][2]``); every call is one C++ op,
  ``torch.ops.tracevllm.vec_linear`` (``cpu_vec_gemm.cpp``), that multiplies and rounds to bf16 once,
  adding the bias first, as a bf16 ``F.linear`` does. The plain weight is dropped (the LM head keeps
  its own, which a tied embedding shares).
- ``CpuVecFusedMlp`` (switch ``cpu_vec_fused_mlp``), the gated SiLU MLP's gate and up projections
  and ``silu_and_mul`` as one op (``vec_silu_and_mul_linear``), the gate's and the up's features of
  each group packed side by side (``pack_gated``), so the ``[T, 2I]`` projection is never written.
  It rounds where the plain code rounds: each projection, the SiLU and the product.

On a CPU with AMX tiles oneDNN multiplies on the tiles and keeps that job, but for single rows
(layers/single_row_vec_gemm.py, which swaps this op in beside oneDNN's); on one with neither,
bf16 weights are float32 copies (``UpcastWeightsLinearMethod``). The op is built once per machine
(``attention/ops/cpu_extension.py``) and loaded at start-up.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tracevllm.attention.ops import cpu_extension
from tracevllm.layers.activation import SiluAndMul
from tracevllm.layers.linear import LinearBase, LinearMethodBase, MergedColumnParallelLinear
from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead

_SOURCE = Path(__file__).with_name("cpu_vec_gemm.cpp")
GROUP = 64  # output features per packed group (cpu_vec_gemm.cpp's kGroup)


def applies(dtype: torch.dtype) -> bool:
    """Whether this CPU and dtype are the op's: bf16, AVX512-BF16, and no AMX tiles."""
    cpu = getattr(torch, "cpu", None)
    return (dtype == torch.bfloat16 and cpu is not None and cpu._is_avx512_bf16_supported()
            and not cpu._is_amx_tile_supported())


def fits(model: nn.Module) -> bool:
    """Whether every linear layer and LM head of ``model`` has an even number of input features (the
    instruction multiplies pairs)."""
    return all(m.weight.shape[1] % 2 == 0 for m in model.modules()
               if isinstance(m, (LinearBase, ParallelLMHead)) and m.weight is not None)


def load() -> bool:
    """Build (once per machine) and load the op; False, with a warning, where it cannot be built."""
    return cpu_extension.load("cpu_vec_gemm", ("-mavx512bf16",), source=_SOURCE,
                              fallback="oneDNN's GEMMs run instead (layers/cpu_gemm.py, OnednnGemm)")


def _vnni_groups(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[64 G, K]`` -> ``[G, K / 2, 64, 2]``: each group of 64 rows VNNI-packed on its own."""
    rows, k = weight.shape
    return weight.reshape(rows // GROUP, GROUP, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """A linear layer's ``weight`` ``[N, K]`` packed for ``vec_linear``, its rows padded with zeros to
    a multiple of 64 (the op writes only the first N outputs)."""
    padding = -weight.shape[0] % GROUP
    return _vnni_groups(F.pad(weight.detach(), (0, 0, 0, padding)))


def pack_gated(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The gate and up weights (``[I, K]`` each, I a multiple of 32) packed for
    ``vec_silu_and_mul_linear``: group g holds gate rows ``32 g .. 32 g + 31``, then the same rows of up."""
    half = GROUP // 2
    intermediate, k = gate.shape
    side_by_side = torch.stack((gate.reshape(-1, half, k), up.reshape(-1, half, k)), dim=1)
    return _vnni_groups(side_by_side.reshape(2 * intermediate, k))


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def vec_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` with ``W`` packed by ``pack_linear``."""
    out = torch.ops.tracevllm.vec_linear(_rows(x), packed, out_features, bias)
    return out.view(*x.shape[:-1], out_features)


class CpuVecGemm(LinearMethodBase):
    """Optimisation "cpu_vec_gemm": the linear layers' bf16 GEMMs in one AVX512-BF16 op a call (the
    module docstring says why)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.vec_packed_weight = pack_linear(layer.weight)
        layer.vec_out_features = layer.weight.shape[0]
        if isinstance(layer, LinearBase):
            layer.weight = None

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return vec_linear(x, layer.vec_packed_weight, layer.vec_out_features, bias)


class CpuVecFusedMlp(nn.Module):
    """Optimisation "cpu_vec_fused_mlp": a gated SiLU MLP whose gate and up projections and SiLU-and-mul
    are one op, ``vec_silu_and_mul_linear``. Swapped in for each MLP that ``fits``; its ``down_proj``
    is the MLP's own (on ``CpuVecGemm``). Why a whole MLP is swapped, not a linear method:
    ``OnednnFusedMlp``'s docstring (layers/cpu_gemm.py)."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        gate, up = mlp.gate_up_proj.weight.detach().chunk(2)  # this rank's [gate slice | up slice]
        self.intermediate_size = gate.shape[0]
        self.packed_gate_up = pack_gated(gate, up)
        self.down_proj = mlp.down_proj

    @staticmethod
    def fits(module: nn.Module) -> bool:
        """Whether ``module`` is ``down_proj(SiluAndMul(gate_up_proj(x)))`` with no bias on gate_up,
        an even input size and an intermediate size (this rank's) that is a multiple of 32."""
        gate_up = getattr(module, "gate_up_proj", None)
        return (isinstance(gate_up, MergedColumnParallelLinear) and len(gate_up.output_sizes) == 2
                and gate_up.bias is None and gate_up.weight is not None
                and gate_up.weight.shape[0] % GROUP == 0 and gate_up.weight.shape[1] % 2 == 0
                and isinstance(getattr(module, "act_fn", None), SiluAndMul)
                and isinstance(getattr(module, "down_proj", None), LinearBase))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.tracevllm.vec_silu_and_mul_linear(_rows(x), self.packed_gate_up, self.intermediate_size)
        return self.down_proj(h.view(*x.shape[:-1], self.intermediate_size))
