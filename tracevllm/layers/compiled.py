"""Optimisation "compiled_norm_act": the element-wise chains of a layer compiled by torch.compile.

Eagerly, ``rms_norm`` is six passes over the activations (add, cast, square, mean, scale, cast and
weight), ``silu_and_mul`` three and the RoPE ``rotate`` five per tensor; compiled, Inductor fuses
each chain into one loop (on CUDA, one kernel). On a CPU that pays on large batches (prefill); on a
decode batch of a few rows the compiled call's own overhead (its guards) costs more than it saves, so
below ``COMPILE_MIN_TOKENS`` rows the plain function runs there. Both measured:
docs/perf-log.md#cpu-against-vllms-cpu-backend-with-the-switchable-speed-ups-2026-11-23-issue-15.
On CUDA every batch runs compiled: a decode step of a small model is bound by kernel launches, each
fused chain saves several, and inside a CUDA graph (worker/cuda_graphs.py) the guards do not run.
One compiled function serves every layer (the weights are arguments), compiled once per process for
symbolic batch sizes; Inductor's on-disk cache makes later processes faster.

``RMSNorm``, ``SiluAndMul`` and ``RotaryEmbedding`` each call their element-wise function through
their ``op``; ``apply_model_optimizations`` swaps a ``CompiledNormAct`` of it in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

COMPILE_MIN_TOKENS = 128


@functools.cache
def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by torch.compile, for any batch size (one compilation, shared by all layers)."""
    # emulate_precision_casts: round to bf16/fp16 wherever the eager code does (Inductor would
    # otherwise keep the float32 value, and the residual stream would drift from the eager one).
    return torch.compile(fn, dynamic=True, options={"emulate_precision_casts": True})


class CompiledNormAct:
    """``fn`` compiled for batches of ``min_tokens`` rows or more, ``fn`` itself below (the rows are
    the first argument's first dimension)."""

    def __init__(self, fn: Callable, min_tokens: int = COMPILE_MIN_TOKENS) -> None:
        self.fn = fn
        self.min_tokens = min_tokens

    def __call__(self, x: torch.Tensor, *args):
        return (compiled(self.fn) if x.shape[0] >= self.min_tokens else self.fn)(x, *args)
