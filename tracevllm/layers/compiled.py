"""torch.compile for the element-wise chains of a layer (optimisation ``compiled_norm_act``).

Eagerly, ``rms_norm`` is six passes over the activations (add, cast, square, mean, scale, cast and
weight), ``silu_and_mul`` three and the RoPE ``rotate`` five per tensor; compiled, Inductor fuses
each chain into one loop. That pays on large batches (prefill). On a decode batch of a few rows the
compiled call's own overhead (its guards) costs more than it saves, so below ``COMPILE_MIN_TOKENS``
rows the plain function runs. Both measured:
docs/perf-log.md#cpu-against-vllms-cpu-backend-with-the-switchable-speed-ups-2026-11-23-issue-15.
One compiled function serves every layer (the weights are arguments), compiled once per process for
symbolic batch sizes; Inductor's on-disk cache makes later processes faster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

COMPILE_MIN_TOKENS = 128


@functools.cache
def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by torch.compile, for any batch size (one compilation, shared by all layers)."""
    # emulate_precision_casts: round to bf16/fp16 wherever the eager code does (Inductor would
    # otherwise keep the float32 value, and the residual stream would drift from the eager one).
    return torch.compile(fn, dynamic=True, options={"emulate_precision_casts": True})


def use_compiled_for(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` (switched on by ``apply_model_optimizations``) runs compiled for this batch."""
    return module.use_compiled and x.shape[0] >= COMPILE_MIN_TOKENS
