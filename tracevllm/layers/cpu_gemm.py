"""The CPU's GEMMs: the linear methods (and the one MLP) swapped in at load where ``F.linear`` is slow.

A linear layer multiplies through its ``linear_method`` (layers/linear.py); the plain one calls
``F.linear``. After the weights are loaded, one choice per model decides what runs instead:
``UpcastWeightsLinearMethod`` by the loader (no speed-up to switch off, but the only sensible way
to run there), the others by ``apply_model_optimizations``, each named as its switch (``OnednnGemm`` is
``onednn_gemm``)::

    device, model dtype                     linear layers and LM head        the gated SiLU MLP
    GPU                                     UnquantizedLinearMethod          LlamaMLP, as built
    float32 on a CPU                        OnednnGemm                       OnednnFusedMlp
                                              + F.linear on the plain weight for batches from
                                                FLOAT32_PLAIN_FROM_ROWS rows (both columns)
    bf16/fp16, CPU without instructions     UpcastWeightsLinearMethod        LlamaMLP, as built
      for them (AVX2 only)
    bf16/fp16, CPU with them                OnednnGemm                       OnednnFusedMlp
      (AVX512-BF16, AMX)                      + CpuFloat32Gemm for large batches where float32
                                                measured faster at load (both columns)

On a CPU with AVX512-BF16 and no AMX, ``CpuVecGemm`` and ``CpuVecFusedMlp`` (layers/cpu_vec_gemm.py) take
oneDNN's place for bf16; with AMX, ``SingleRowVecGemm`` and ``SingleRowVecFusedMlp``
(layers/single_row_vec_gemm.py) wrap oneDNN's and take single rows from them, where measured faster.
With ``onednn_fused_mlp`` off, the MLP stays as built and its ``gate_up_proj`` runs on ``OnednnGemm``;
with ``onednn_gemm`` off, the plain ``F.linear`` and ``LlamaMLP`` run (natively in bf16/fp16 there).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tracevllm.layers.activation import SiluAndMul
from tracevllm.layers.linear import LinearBase, LinearMethodBase, MergedColumnParallelLinear
from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead

logger = logging.getLogger(__name__)


def cpu_lacks_half_gemm(dtype: torch.dtype) -> bool:
    """True for bf16/fp16 on a CPU without instructions for them (e.g. AVX2 only), where torch
    emulates a half-precision GEMM, several times slower than float32 (docs/perf-log.md#source-figures)."""
    cpu = getattr(torch, "cpu", None)
    if dtype == torch.bfloat16:
        return not (cpu and (cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()))
    return dtype == torch.float16 and not (cpu and cpu._is_amx_fp16_supported())


def cpu_has_onednn_gemm(dtype: torch.dtype) -> bool:
    """True where oneDNN runs the GEMM natively: float32 on any CPU torch built oneDNN for, bf16/fp16
    on a CPU with instructions for them."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype in (torch.bfloat16, torch.float16) and not cpu_lacks_half_gemm(dtype))


def set_linear_method(model: nn.Module, method: LinearMethodBase) -> None:
    """Swap ``method`` in for every linear layer of ``model`` (``model`` itself included) and its LM
    head: it prepares each one's weights once, then serves all their calls."""
    for module in list(model.modules()):
        if isinstance(module, (LinearBase, ParallelLMHead)):
            method.process_weights_after_loading(module)
            module.linear_method = method


class UpcastWeightsLinearMethod(LinearMethodBase):
    """bf16/fp16 GEMMs on float32 copies of the weights, on a CPU without bf16/fp16 instructions.

    Not a switch: the loader always uses it there. The layer's own parameters (weight and bias)
    become float32 copies of their half-precision values: the same numbers, twice the memory, and no
    conversion of the whole weight on every call (which would cost a decode step as much as the GEMM
    itself). ``x`` is multiplied in float32 and the result rounded back once, which is what a native
    bf16 GEMM does: the products of half-precision values are exact in float32, and the sums
    accumulate in float32. A weight tied to another module (an LM head sharing the embedding) is
    untied: the other module keeps its own.
    """

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for name, param in list(layer.named_parameters(recurse=False)):
            setattr(layer, name, nn.Parameter(param.data.float(), requires_grad=False))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x.float(), layer.weight, bias).to(x.dtype)


# The batch size oneDNN packs a weight for; it picks the blocked layout from this hint. Every hint from 16
# to 4,096 gives one layout, faster than hint 1's at most batch sizes (docs/perf-log.md#onednn-weight-layout),
# and with it the GEMM rounds as F.linear does, bit for bit on 2 threads (tests/layers/test_cpu_gemm.py).
ONEDNN_PACK_BATCH_HINT = 64


def pack_for_onednn(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` reordered once into oneDNN's blocked layout for ``_linear_pointwise``."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ONEDNN_PACK_BATCH_HINT)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` with ``W`` packed by ``pack_for_onednn``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class CpuFloat32Gemm:
    """Optimisation "cpu_float32_gemm": batches of many rows multiplied in float32, where that is faster.

    A bf16 GEMM on a CPU is not always faster than a float32 one. With AMX tiles it is, by far; but
    some CPUs report AVX512-BF16 and run its dot products at half the float32 FMA rate. There large
    batches run faster in float32, conversions included, and a single row slower (a decode step
    streams the weights from memory, and float32 weights are twice the bytes):
    docs/perf-log.md#source-figures.

    So ``OnednnGemm`` and ``OnednnFusedMlp`` keep a second, float32 packed copy of each weight
    (``pack``) and send a batch of at least ``min_rows`` rows through it (``takes``): ``x`` converted
    to float32, the same GEMM, the result rounded back to ``x``'s dtype once. The products of bf16
    values are exact in float32 and the sums accumulate in float32 either way, so this computes what
    the bf16 GEMM computes, up to the order of the sums.

    Which CPUs gain cannot be read off the CPU flags (an AMD EPYC with AVX512-BF16 runs bf16 the
    faster), so ``measured_on`` times both on the model's own weights when it
    loads, and the switch only acts where float32 won clearly. The copy costs 4 bytes a weight; it
    is not made where it would take more than a quarter of the memory still available.
    """

    def __init__(self, min_rows: int) -> None:
        self.min_rows = min_rows

    def takes(self, x: torch.Tensor) -> bool:
        return x.numel() >= self.min_rows * x.shape[-1]

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        return pack_for_onednn(weight.float())

    @classmethod
    def measured_on(cls, model: nn.Module) -> CpuFloat32Gemm | None:
        """For a model about to be packed for oneDNN: the method for its largest batches, or None where
        float32 did not win (``measure_float32_min_rows`` on its largest weights) or its copies would
        not fit in a quarter of the memory available."""
        weights = [m.weight for m in model.modules()
                   if isinstance(m, (LinearBase, ParallelLMHead)) and m.weight is not None]
        if not weights:
            return None
        if not copies_fit(4 * sum(w.numel() for w in weights), "cpu_float32_gemm", "the float32 copies"):
            return None
        # Measured on the layer shape that holds most of the weights (the MLP's, in the models here).
        layers = [m.weight for m in model.modules() if isinstance(m, LinearBase) and m.weight is not None]
        if not layers:
            return None
        shape = max({w.shape for w in layers}, key=lambda s: sum(w.numel() for w in layers if w.shape == s))
        same = [w for w in layers if w.shape == shape][:MEASURED_WEIGHTS]
        rows = measure_float32_min_rows(same, [pack_for_onednn(w) for w in same])
        if rows is None:
            logger.info("cpu_float32_gemm: not used: %s GEMMs measured faster than float32 here", same[0].dtype)
            return None
        logger.info("cpu_float32_gemm: GEMMs of %d rows or more run in float32 (measured faster here than %s); "
                    "float32 weight copies: %.2f GiB", rows, same[0].dtype, copy_bytes / 2**30)
        return cls(rows)


# float32 models: oneDNN's packed GEMM is the faster up to a few hundred rows (decode batches), MKL's
# F.linear on the plain weight from about 512 (prefill chunks; docs/perf-log.md#float32-prefill-on-mkl).
# So float32 layers keep their plain weight beside the packed one, and batches from this many rows run
# the plain path.
FLOAT32_PLAIN_FROM_ROWS = 512


def float32_plain_from_rows(model: nn.Module) -> int | None:
    """For a float32 model about to be packed: from how many rows its GEMMs run ``F.linear`` on the
    plain weights (kept), or None (plain weights dropped) where the packed copies would take more than a
    quarter of the memory available."""
    copy_bytes = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, LinearBase) and m.weight is not None)
    available = available_memory_bytes()
    if available is not None and copy_bytes > available // 4:
        logger.info("onednn_gemm: float32 weights packed only, their plain layout dropped: keeping both (%.1f GiB "
                    "more) would take over a quarter of the %.1f GiB available", copy_bytes / 2**30, available / 2**30)
        return None
    return FLOAT32_PLAIN_FROM_ROWS


def takes_plain(x: torch.Tensor, plain_from_rows: int | None) -> bool:
    return plain_from_rows is not None and x.numel() >= plain_from_rows * x.shape[-1]


class OnednnGemm(LinearMethodBase):
    """Optimisation "onednn_gemm": the GEMM on a weight reordered once into oneDNN's blocked layout.

    Faster than ``F.linear`` where measured (the packed layout streams through the cache;
    ``F.linear`` re-blocks the plain one on every call; docs/perf-log.md#source-figures).
    A linear layer's plain weight is dropped, as vLLM's CPU backend does, so the
    model is not held twice; the LM head keeps its weight, which a tied embedding shares. With
    ``float32`` (optimisation ``cpu_float32_gemm``), large batches run on a float32 packed copy. With
    ``plain_from_rows`` (float32 models), the plain weight stays, and batches from that many rows
    run ``F.linear`` on it.
    """

    def __init__(self, float32: CpuFloat32Gemm | None = None, plain_from_rows: int | None = None) -> None:
        self.float32 = float32
        self.plain_from_rows = plain_from_rows

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.packed_weight = pack_for_onednn(layer.weight)
        if self.float32 is not None:
            layer.packed_weight_float32 = self.float32.pack(layer.weight)
        if isinstance(layer, LinearBase) and self.plain_from_rows is None:
            layer.weight = None

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if takes_plain(x, self.plain_from_rows):
            return F.linear(x, layer.weight, bias)
        if self.float32 is not None and self.float32.takes(x):
            bias = bias.float() if bias is not None else None
            return onednn_linear(x.float(), layer.packed_weight_float32, bias).to(x.dtype)
        return onednn_linear(x, layer.packed_weight, bias)


def silu_and_mul_gemms(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(x W_gate^T) * (x W_up^T)`` in two oneDNN GEMMs on packed ``gate`` and ``up``, whose
    epilogues apply the SiLU and the product."""
    gated = torch.ops.mkldnn._linear_pointwise(x, gate, None, "swish", [], "")
    return torch.ops.mkldnn._linear_pointwise.binary(x, gated, up, None, "mul")


class OnednnFusedMlp(nn.Module):
    """Optimisation "onednn_fused_mlp": a gated SiLU MLP whose SiLU and product run in the epilogues of
    its gate and up GEMMs, so that neither the ``[T, 2I]`` projection nor the gate is written and
    read again. Swapped in for each MLP that ``fits`` (``LlamaMLP``); its ``down_proj`` is the MLP's own.

    Faster from a few rows on, a little slower at one row: docs/perf-log.md#source-figures.
    The SiLU's result is not rounded to bf16 before the product, as the eager code rounds it:
    values differ from the plain path's by up to one bf16 step.

    Why a whole MLP is swapped and not a linear method: the fusion spans two of the MLP's modules, the
    gate_up GEMM and the activation after it. As a linear method, ``gate_up_proj`` would return the
    activated ``[T, I]`` product instead of the ``[T, 2I]`` projection its name promises, and
    ``act_fn`` would have to become an identity in step: two swaps that are right only together. So
    ``LlamaMLP`` stays the plain three lines, and the fused version is all here, in one forward.
    """

    def __init__(self, mlp: nn.Module, float32: CpuFloat32Gemm | None = None,
                 plain_from_rows: int | None = None) -> None:
        super().__init__()
        gate, up = mlp.gate_up_proj.weight.detach().chunk(2)  # this rank's [gate slice | up slice]
        self.packed_gate_up = (pack_for_onednn(gate), pack_for_onednn(up))
        self.float32 = float32  # optimisation "cpu_float32_gemm": the same two GEMMs in float32
        self.packed_gate_up_float32 = (float32.pack(gate), float32.pack(up)) if float32 is not None else None
        # float32 models: from plain_from_rows rows, the plain MLP's GEMM and activation (OnednnGemm's note)
        self.plain_from_rows = plain_from_rows
        self.gate_up_weight = mlp.gate_up_proj.weight.detach() if plain_from_rows is not None else None
        self.act_fn = mlp.act_fn if plain_from_rows is not None else None
        self.down_proj = mlp.down_proj

    @staticmethod
    def fits(module: nn.Module) -> bool:
        """Whether ``module`` is an MLP of the form ``down_proj(SiluAndMul(gate_up_proj(x)))`` whose
        gate_up has no bias."""
        gate_up = getattr(module, "gate_up_proj", None)
        return (isinstance(gate_up, MergedColumnParallelLinear) and len(gate_up.output_sizes) == 2
                and gate_up.bias is None and isinstance(getattr(module, "act_fn", None), SiluAndMul)
                and isinstance(getattr(module, "down_proj", None), LinearBase))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if takes_plain(x, self.plain_from_rows):
            h = self.act_fn(F.linear(x, self.gate_up_weight))
        elif self.float32 is not None and self.float32.takes(x):
            h = silu_and_mul_gemms(x.float(), *self.packed_gate_up_float32).to(x.dtype)
        else:
            h = silu_and_mul_gemms(x, *self.packed_gate_up)
        return self.down_proj(h)


# cpu_float32_gemm's measurement. Batch sizes tried, largest first; float32 must beat the half-precision
# GEMM by WIN_MARGIN at a size and at every larger one to be used from that size on. None below 32: there
# a forward, whose weights stream from memory, favours the half-precision copy's half bytes more than a
# measurement on a few weights shows (docs/perf-log.md#source-figures).
CANDIDATE_ROWS = (512, 256, 128, 64, 32)
WIN_MARGIN = 0.9
# How many of the model's weights a measurement multiplies in turn: enough that they do not all stay
# in the cache, as in a forward.
MEASURED_WEIGHTS = 4


def median_seconds(fn, repeats: int = 3) -> float:
    fn()  # oneDNN builds its kernel for the shape on the first call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_float32_min_rows(weights: Sequence[torch.Tensor], half_packed: Sequence[torch.Tensor]) -> int | None:
    """The smallest of ``CANDIDATE_ROWS`` from which a float32 GEMM (packed copy, conversions included)
    beat the half-precision one on ``half_packed`` (the same ``weights``, oneDNN-packed) at that batch
    size and every larger one; None where it did not win even at the largest."""
    weights, half_packed = list(weights)[:MEASURED_WEIGHTS], list(half_packed)[:MEASURED_WEIGHTS]
    float_packed = [CpuFloat32Gemm.pack(w) for w in weights]
    dtype, in_features = weights[0].dtype, weights[0].shape[1]
    found = None
    with torch.inference_mode():
        for rows in CANDIDATE_ROWS:
            x = torch.randn(rows, in_features).to(dtype)
            half = median_seconds(lambda: [onednn_linear(x, p) for p in half_packed])
            single = median_seconds(lambda: [onednn_linear(x.float(), p).to(dtype) for p in float_packed])
            logger.debug("cpu_float32_gemm: %d rows: %s %.2f ms, float32 %.2f ms", rows, dtype, half * 1e3,
                         single * 1e3)
            if single > WIN_MARGIN * half:
                break
            found = rows
    return found


def copies_fit(copy_bytes: int, switch: str, copies: str) -> bool:
    """Whether a switch's weight ``copies`` (``copy_bytes``) fit in a quarter of the memory available
    now; where they do not, the log says that ``switch`` is not used, and why."""
    available = available_memory_bytes()
    if available is not None and copy_bytes > available // 4:
        logger.info("%s: not used: %s (%.1f GiB) would take over a quarter of the %.1f GiB available", switch, copies,
                    copy_bytes / 2**30, available / 2**30)
        return False
    return True


def available_memory_bytes() -> int | None:
    """Memory the system has free now (``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
