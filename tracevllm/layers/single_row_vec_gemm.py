"""Optimisation "single_row_vec_gemm": on a CPU with AMX tiles, one-row GEMMs on AVX512-BF16 dot products.

A decode step of one running sequence (the latency case: a chat, a notebook's ``generate``) multiplies
every weight by one row. oneDNN's bf16 GEMM (``OnednnGemm``, layers/cpu_gemm.py) runs it on the AMX
tiles, which hold 16 rows: 15 of them multiply nothing, and each call pays oneDNN's fixed cost. The
step is a pass over the weights from memory, and ``cpu_vec_gemm``'s op (layers/cpu_vec_gemm.py), one
loop of ``vdpbf16ps`` over weights packed in that instruction's layout, makes that pass faster: on a
2-core AMX Xeon a one-row decode step of the bundled model took 19.3 ms against 23.8, and the tiles
won again from two to four rows on, by shape (docs/perf-log.md#cpu-one-row-gemms-on-avx512-bf16-beside-the-amx-tiles-2026-12-07-issue-45).

So each layer keeps two packed copies of its weight, oneDNN's and the vec op's, and a call sends a
single row to the vec op and anything larger to oneDNN:

- ``SingleRowVecGemm``, a linear method wrapping the one oneDNN serves the model with;
- ``SingleRowVecFusedMlp``, the gated MLP: ``CpuVecFusedMlp`` for one row, the oneDNN fused MLP for more
  (with ``cpu_vec_fused_mlp`` off, the MLP is left to oneDNN alone).

Whether the vec op wins cannot be read off the CPU flags, so ``measured_on`` times both on the model's
own weights when it loads; the switch acts only where the vec op won clearly. The second copy costs 2
bytes a weight, and is not made where it would take more than a quarter of the memory available.
The vec op sums in another order than oneDNN, so a single row's result can differ from a batch's by
one bf16 step where the float32 sums round apart (as ``cpu_vec_gemm``'s does on CPUs without tiles).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from tracevllm.layers.cpu_gemm import copies_fit, median_seconds, onednn_linear, pack_for_onednn
from tracevllm.layers.cpu_vec_gemm import CpuVecFusedMlp, pack_linear, vec_linear
from tracevllm.layers.linear import LinearBase, LinearMethodBase
from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead

logger = logging.getLogger(__name__)

# The vec op must take at most this share of oneDNN's time on one row to be used.
WIN_MARGIN = 0.9
# How many of the model's linear weights, in a forward's order, a measurement multiplies in turn: every
# shape of a few layers, and enough bytes that they do not all stay in the core's caches, as in a
# forward, which streams every weight once.
MEASURED_WEIGHTS = 16


def applies(dtype: torch.dtype) -> bool:
    """Whether this CPU and dtype are the switch's: bf16, AMX tiles, and AVX512-BF16 for the vec op."""
    cpu = getattr(torch, "cpu", None)
    return (dtype == torch.bfloat16 and cpu is not None and cpu._is_amx_tile_supported()
            and cpu._is_avx512_bf16_supported())


def single_row(x: torch.Tensor) -> bool:
    return x.numel() == x.shape[-1]


class SingleRowVecGemm(LinearMethodBase):
    """A linear method: one row through the vec op on its own packed copy, more through ``large``."""

    def __init__(self, large: LinearMethodBase) -> None:
        self.large = large

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.vec_packed_weight = pack_linear(layer.weight)  # before ``large`` drops the plain weight
        layer.vec_out_features = layer.weight.shape[0]
        self.large.process_weights_after_loading(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if single_row(x):
            return vec_linear(x, layer.vec_packed_weight, layer.vec_out_features, bias)
        return self.large.apply(layer, x, bias)

    @staticmethod
    def measured_on(model: nn.Module) -> bool:
        """For a bf16 model about to be packed for oneDNN: whether the vec op multiplied one row by the
        model's first ``MEASURED_WEIGHTS`` linear weights, in the order a forward takes them (the first
        four decoder layers' in the models here), in at most ``WIN_MARGIN`` of oneDNN's time, and the
        second copies fit in a quarter of the memory available."""
        weights = [m.weight for m in model.modules()
                   if isinstance(m, (LinearBase, ParallelLMHead)) and m.weight is not None]
        layers = [m.weight for m in model.modules() if isinstance(m, LinearBase) and m.weight is not None]
        if not layers:
            return False
        copy_bytes = 2 * sum(w.numel() for w in weights)
        if not copies_fit(copy_bytes, "single_row_vec_gemm", "the vec op's copies"):
            return False
        sample = layers[:MEASURED_WEIGHTS]
        vec, onednn = [pack_linear(w) for w in sample], [pack_for_onednn(w) for w in sample]
        with torch.inference_mode():
            xs = {k: torch.randn(1, k).to(sample[0].dtype) for k in {w.shape[1] for w in sample}}  # by input size
            ours = median_seconds(lambda: [vec_linear(xs[w.shape[1]], p, w.shape[0]) for w, p in zip(sample, vec)],
                                  repeats=5)
            theirs = median_seconds(lambda: [onednn_linear(xs[w.shape[1]], p) for w, p in zip(sample, onednn)],
                                    repeats=5)
        won = ours <= WIN_MARGIN * theirs
        logger.info("single_row_vec_gemm: %s: one row by the first %d linear weights: vec op %.2f ms, oneDNN %.2f ms%s",
                    "used" if won else "not used", len(sample), ours * 1e3, theirs * 1e3,
                    f"; second copies {copy_bytes / 2**20:.0f} MiB" if won else "")
        return won


class SingleRowVecFusedMlp(nn.Module):
    """The gated SiLU MLP: one row through ``CpuVecFusedMlp``, more through ``large`` (oneDNN's fused
    MLP); both end in the MLP's own ``down_proj``, kept here too, as every fused MLP keeps it."""

    def __init__(self, mlp: nn.Module, large: nn.Module) -> None:
        super().__init__()
        self.single = CpuVecFusedMlp(mlp)
        self.large = large
        self.down_proj = mlp.down_proj

    @staticmethod
    def fits(module: nn.Module) -> bool:
        return CpuVecFusedMlp.fits(module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.single(x) if single_row(x) else self.large(x)
