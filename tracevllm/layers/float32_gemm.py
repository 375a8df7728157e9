"""Optimisation "cpu_float32_gemm": batches of many rows multiplied in float32, where that is faster.

A bf16 GEMM on a CPU is not always faster than a float32 one. With AMX tiles it is, by far; but some
CPUs report AVX512-BF16 and run its dot products at half the float32 FMA rate. On this project's
2-core Xeon whose AMX the hypervisor hides (docs/perf.md), a 2,048-cube GEMM ran at 165 GFLOP/s in
bf16 and 327 in float32, and SmolLM2's 30 layers of GEMMs at 1,024 rows took 1,287 ms in bf16 on
oneDNN-packed weights against 788 in float32, conversions included. At one row it is the other way
round (12.1 against 19.1 ms): a decode step streams the weights from memory, and float32 weights
are twice the bytes.

So on such a CPU each packed layer keeps a second copy of its weight, float32 and oneDNN-packed
(``packed_weight_float32``), and ``apply_linear`` sends a batch of at least ``float32_min_rows``
rows through it: ``x`` converted to float32, one GEMM, the result rounded back to ``x``'s dtype
once. The products of bf16 values are exact in float32 and the sums accumulate in float32 either
way, so this computes what the bf16 GEMM computes, up to the order of the sums.

Which CPUs gain cannot be read off the CPU flags (an AMD EPYC with AVX512-BF16 measured bf16 2-2.5x
faster than float32), so ``measure_float32_min_rows`` times both on the model's own weights when it
loads, and the switch only acts where float32 won clearly. The copy costs 4 bytes a weight; it is
not made where it would take more than a quarter of the memory still available.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

# Batch sizes tried, largest first; float32 must beat the half-precision GEMM by WIN_MARGIN at a size
# and at every larger one to be used from that size on. None below 32: there a forward, whose weights
# stream from memory, favours the half-precision copy's half bytes more than a measurement on a few
# weights shows (on the Xeon above, 16 rows through 30 layers: 31.4 ms in float32 against 28.3 in
# bf16, while 4 weights measured 1.29 against 1.52 ms).
CANDIDATE_ROWS = (512, 256, 128, 64, 32)
WIN_MARGIN = 0.9
# How many of the model's weights a measurement multiplies in turn: enough that they do not all stay
# in the cache, as in a forward.
MEASURED_WEIGHTS = 4


def pack_float32(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` as float32, reordered once into oneDNN's blocked layout."""
    from tracevllm.layers.linear import ONEDNN_PACK_BATCH_HINT

    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().float().contiguous(), ONEDNN_PACK_BATCH_HINT)


def float32_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T + b`` in float32 on ``packed`` (from ``pack_float32``), rounded to ``x``'s dtype."""
    bias = bias.float() if bias is not None else None
    return torch.ops.mkldnn._linear_pointwise(x.float(), packed, bias, "none", [], "").to(x.dtype)


def _median_seconds(fn, repeats: int = 3) -> float:
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
    float_packed = [pack_float32(w) for w in weights]
    dtype, in_features = weights[0].dtype, weights[0].shape[1]
    found = None
    with torch.inference_mode():
        for rows in CANDIDATE_ROWS:
            x = torch.randn(rows, in_features).to(dtype)
            half = _median_seconds(lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                            for p in half_packed])
            single = _median_seconds(lambda: [float32_linear(x, p, None) for p in float_packed])
            logger.debug("cpu_float32_gemm: %d rows: %s %.2f ms, float32 %.2f ms", rows, dtype, half * 1e3,
                         single * 1e3)
            if single > WIN_MARGIN * half:
                break
            found = rows
    return found


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


def choose_float32_min_rows(model: torch.nn.Module) -> int | None:
    """For a model about to be packed for oneDNN: the batch size from which its GEMMs go to float32
    (``measure_float32_min_rows`` on its largest weights), or None: float32 did not win, or its copies
    would not fit in a quarter of the memory available."""
    from tracevllm.layers.linear import LinearBase, pack_for_onednn
    from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead

    weights = [m.weight for m in model.modules()
               if isinstance(m, (LinearBase, ParallelLMHead)) and getattr(m, "weight", None) is not None]
    if not weights:
        return None
    copy_bytes, available = 4 * sum(w.numel() for w in weights), available_memory_bytes()
    if available is not None and copy_bytes > available // 4:
        logger.info("cpu_float32_gemm: not used: the float32 copies (%.1f GiB) would take over a quarter of the "
                    "%.1f GiB available", copy_bytes / 2**30, available / 2**30)
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
    else:
        logger.info("cpu_float32_gemm: GEMMs of %d rows or more run in float32 (measured faster here than %s); "
                    "float32 weight copies: %.2f GiB", rows, same[0].dtype, copy_bytes / 2**30)
    return rows
