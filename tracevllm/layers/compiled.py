"""Optimisation "compiled_norm_act": on CUDA, the element-wise chains of a layer compiled by torch.compile.

Eagerly, ``rms_norm`` is six kernels over the activations (add, cast, square, mean, scale, cast and
weight), ``silu_and_mul`` three and the RoPE ``rotate`` five per tensor; compiled, Inductor fuses
each chain into one kernel. A decode step of a small model is bound by kernel launches, and each
fused chain saves several; inside a CUDA graph (worker/cuda_graphs.py) the compiled call's guards do
not run. One compiled function serves every layer (the weights are arguments), compiled once per
process for symbolic batch sizes, by the start-up's warm-up (worker/gpu_worker.py), not in a request.

On CPU the same chains are C++ ops instead (optimisation "cpu_norm_act", cpu_norm_act.py): built once
per machine, where a compile would run in each process (5-13 s), and faster than the compiled code at
every batch size measured (benchmarks/norm_act.py).

``RMSNorm``, ``SiluAndMul`` and ``RotaryEmbedding`` each call their element-wise function through
their ``op``; ``apply_model_optimizations`` swaps a ``CompiledNormAct`` of it in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from tracevllm.worker import one_time_costs


@functools.cache
def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by torch.compile, for any batch size (one compilation, shared by all layers).
    Each compilation is recorded as a one-time cost: a step that compiles says so in its trace."""
    one_time_costs.watch_torch_compile()
    # emulate_precision_casts: round to bf16/fp16 wherever the eager code does (Inductor would
    # otherwise keep the float32 value, and the residual stream would drift from the eager one).
    return torch.compile(fn, dynamic=True, options={"emulate_precision_casts": True})


class CompiledNormAct:
    """``fn`` compiled (the compilation is shared by every module that holds the same ``fn``)."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def __call__(self, *args):
        return compiled(self.fn)(*args)
