"""The engine's switchable optimisations: each one named, on by default, and off on request.

A learner can turn any of them off and run the plain version of that step, token for token the same
model (``LLM(disable_optimizations=["onednn_gemm"])``, ``--disable-optimizations onednn_gemm``, or
``all``); ``tracevllm bench throughput --ablation`` runs with each one off in turn and prints what
each is worth. docs/perf.md has the measured figures. Where no option says otherwise, the environment
variable ``TRACEVLLM_DISABLE_OPTIMIZATIONS`` (comma-separated names, or ``all``) does, so a whole test
run can go through the plain code: ``TRACEVLLM_DISABLE_OPTIMIZATIONS=all pytest tests``.

The plain code is the default code path of every module. ``apply_model_optimizations`` swaps objects
into a loaded model (a linear method, a module); the attention optimisations pick the attention
backend and its ops at start-up (``attention/selector.py``, ``attention/backends/cpu_attn.py``); the
runner reads the others from the config. Each name is the name of what implements it: a function's
name (``two_level_sampling``), a class's name in snake_case (``onednn_gemm`` is ``OnednnGemm`` in
layers/cpu_gemm.py), or a C++ op's module (``cpu_paged_decode`` is attention/ops/cpu_paged_decode.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations here; config.py reads OPTIMIZATIONS for the CLI without torch
    import torch
    from torch import nn

DISABLE_ENV = "TRACEVLLM_DISABLE_OPTIMIZATIONS"

OPTIMIZATIONS: dict[str, str] = {
    "onednn_gemm": "CPU GEMMs on weights pre-packed once for oneDNN (in float32, or in bf16/fp16 where the CPU has "
                   "instructions for them), instead of F.linear re-reading the plain layout every call; float32 "
                   "batches of 512 rows or more keep F.linear, faster there (layers/cpu_gemm.py, OnednnGemm)",
    "onednn_fused_mlp": "the MLP's SiLU and product done in the epilogues of two oneDNN GEMMs (gate, up) "
                        "instead of one GEMM and two element-wise passes; needs onednn_gemm "
                        "(layers/cpu_gemm.py, OnednnFusedMlp)",
    "cpu_vec_gemm": "on CPUs with AVX512-BF16 but no AMX tiles (AMD Zen 4, Zen 5), bf16 GEMMs in one C++ op a call "
                    "on AVX512-BF16 dot products (vdpbf16ps), on weights packed once in that instruction's "
                    "layout, instead of oneDNN's GEMM and its fixed cost of about 12 us a call; takes the place "
                    "of onednn_gemm there (layers/cpu_vec_gemm.py, CpuVecGemm)",
    "cpu_vec_fused_mlp": "the MLP's gate and up projections and its SiLU-and-mul in one pass of cpu_vec_gemm's op, "
                         "instead of a GEMM and an element-wise pass; needs cpu_vec_gemm "
                         "(layers/cpu_vec_gemm.py, CpuVecFusedMlp)",
    "single_row_vec_gemm": "on CPUs with AMX tiles, bf16 GEMMs of one row (a decode step of one sequence) on "
                           "cpu_vec_gemm's AVX512-BF16 op, on a second copy of the weights packed in its layout, "
                           "instead of oneDNN's tiles, which hold 16 rows; the MLP's too with cpu_vec_fused_mlp; "
                           "where measured faster at load; needs onednn_gemm (layers/single_row_vec_gemm.py, "
                           "SingleRowVecGemm)",
    "decode_plan": "paged attention in the cpu backend: the step's decode and prefill rows, the decode buckets, their "
                   "cache slots and masks are computed once per step and read by every layer, instead of by each "
                   "layer again (attention/backends/cpu_attn.py, DecodePlan)",
    "cpu_paged_decode": "on CPU, decode attention in one C++ op (built once by torch.utils.cpp_extension) that "
                        "reads each row's K/V in place from the paged cache, instead of gathering them into a "
                        "padded copy and running SDPA on it (attention/backends/cpu_attn.py, "
                        "attention/ops/cpu_paged_decode.cpp)",
    "cpu_amx_decode": "on CPUs with AMX tiles, the decode op's two products (scores and values) on the tiles, in bf16, "
                      "instead of float32 vector registers; same cache, read in place; needs cpu_paged_decode "
                      "(attention/backends/cpu_attn.py, attention/ops/cpu_amx_decode.cpp)",
    "cpu_vec_decode": "on CPUs with AVX512-BF16 (AMD Zen 4, Zen 5; after cpu_amx_decode where there are tiles), the "
                      "decode op's two products on AVX512-BF16 dot products (vdpbf16ps) straight from the bf16 cache "
                      "rows, instead of widening every key and value to float32 first; same cache, read in place; "
                      "needs cpu_paged_decode (attention/backends/cpu_attn.py, attention/ops/cpu_vec_decode.cpp)",
    "cpu_amx_prefill": "on CPUs with AMX tiles, bf16 prefill attention in one C++ flash-attention op whose matrix "
                       "products run on the tiles, in 64 x 64 blocks that skip what the causal mask hides, "
                       "reading K/V from the paged cache; instead of one SDPA per prefill "
                       "(attention/backends/cpu_attn.py, attention/ops/cpu_amx_prefill.cpp)",
    "cpu_vec_prefill": "on CPUs with AVX512-BF16 but no AMX tiles (AMD Zen 4), the same prefill op as cpu_amx_prefill "
                       "with its matrix products on AVX512-BF16 dot-product instructions (vdpbf16ps), instead of "
                       "one SDPA per prefill (attention/backends/cpu_attn.py, attention/ops/cpu_amx_prefill.cpp, "
                       "dot_product_gemm)",
    "rope_cache": "RoPE: one module for all layers, gathering each step's cos/sin once instead of once per "
                  "layer (layers/rope_cache.py, RopeCache)",
    "two_level_sampling": "on CPU, random sampling finds the token through the cumulative sum of 256-token block "
                          "totals, then of one block, instead of one over the whole vocabulary, and skips "
                          "the softmax's division (sample/ops/topk_topp_sampler.py)",
    "cpu_norm_act": "on CPU, RMSNorm (with its residual add), SiLU-and-mul and the RoPE rotation as C++ ops (built "
                    "once per machine by torch.utils.cpp_extension, loaded at start-up), one pass over memory each "
                    "instead of a dispatch per element-wise operation, rounding where the plain code rounds "
                    "(layers/cpu_norm_act.py, layers/cpu_norm_act.cpp)",
    "compiled_norm_act": "on CUDA, RMSNorm (with its residual add), SiLU-and-mul and the RoPE rotation compiled by "
                         "torch.compile into one kernel each, compiled by the start-up's warm-up "
                         "(layers/compiled.py, CompiledNormAct)",
    "cpu_float32_gemm": "on CPUs where a float32 GEMM measured faster than a bf16/fp16 one at start-up (some Xeons "
                        "whose AMX is hidden run bf16 dot products at half the float32 rate), GEMMs of batches "
                        "from the measured size on run in float32 on a second, float32 packed copy of the weights; "
                        "needs onednn_gemm (layers/cpu_gemm.py, CpuFloat32Gemm)",
    "cuda_graphs": "on CUDA with the triton attention backend and one rank, decode-only steps replay a CUDA graph "
                   "of the forward captured at start-up for their batch size (padded to the next of 1, 2, 4, 8, "
                   "16, ... up to max_num_seqs), instead of launching every layer's kernels from Python; also off "
                   "with enforce_eager, as in vLLM (worker/cuda_graphs.py, CudaGraphs)",
    "cpu_thread_follower": "on CPU with one rank and no --cpu-threads, the torch thread count measured again when "
                           "other processes' load on the cores changes (a neighbour takes a core, or gives it "
                           "back), instead of once at start-up (worker/cpu_thread_follower.py, CpuThreadFollower)",
    "keep_freed_memory": "on CPU, glibc's malloc keeps the memory a step frees for the next step (its mmap and "
                         "trim thresholds raised), instead of returning it to the system and page-faulting it "
                         "back in, operator after operator; process-wide once set (worker/cpu_malloc.py)",
    "observer_process": "in a vLLM run recorded by tracevllm.vllm's TracingScheduler (not tracevllm's own engine), the "
                        "tracer in a child process at the lowest priority, fed each step's events through a pipe, "
                        "instead of building and exporting the spans in vLLM's engine core, where they hold its GIL "
                        "(tracing/observer_process.py, ObserverProcess)",
}
# The switches of tracevllm.vllm's recorder, which tracevllm's own engine does not read.
VLLM_RECORDER_OPTIMIZATIONS = frozenset({"observer_process"})


@dataclass(frozen=True)
class OptimizationConfig:
    """Which of ``OPTIMIZATIONS`` are off (all are on by default)."""

    disabled: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted(self.disabled - OPTIMIZATIONS.keys())
        if unknown:
            raise ValueError(f"Unknown optimization(s) {unknown}; the names are {list(OPTIMIZATIONS)} (or 'all').")

    @classmethod
    def from_names(cls, names: list[str] | None = None) -> OptimizationConfig:
        """From ``disable_optimizations``: names of ``OPTIMIZATIONS``, or ``["all"]``; None: from
        ``$TRACEVLLM_DISABLE_OPTIMIZATIONS`` (unset: every optimisation on)."""
        if names is None:
            names = [n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()]
        return cls(frozenset(OPTIMIZATIONS) if "all" in names else frozenset(names))

    def enabled(self, name: str) -> bool:
        assert name in OPTIMIZATIONS, name
        return name not in self.disabled


def apply_model_optimizations(model: nn.Module, config: OptimizationConfig, device: torch.device,
                              dtype: torch.dtype) -> None:
    """Swap the objects of the optimisations that ``config`` leaves on into the loaded ``model``."""
    import torch

    from tracevllm.layers import cpu_norm_act, cpu_vec_gemm, single_row_vec_gemm
    from tracevllm.layers.activation import SiluAndMul, silu_and_mul
    from tracevllm.layers.compiled import CompiledNormAct
    from tracevllm.layers.cpu_gemm import (
        CpuFloat32Gemm,
        OnednnFusedMlp,
        OnednnGemm,
        cpu_has_onednn_gemm,
        float32_plain_from_rows,
        set_linear_method,
    )
    from tracevllm.layers.cpu_vec_gemm import CpuVecFusedMlp, CpuVecGemm
    from tracevllm.layers.layernorm import RMSNorm, rms_norm
    from tracevllm.layers.rope_cache import RopeCache
    from tracevllm.layers.rotary_embedding import RotaryEmbedding, rotate
    from tracevllm.layers.single_row_vec_gemm import SingleRowVecFusedMlp, SingleRowVecGemm

    if (config.enabled("cpu_vec_gemm") and device.type == "cpu" and cpu_vec_gemm.applies(dtype)
            and cpu_vec_gemm.fits(model) and cpu_vec_gemm.load()):
        if config.enabled("cpu_vec_fused_mlp"):
            _swap_mlps(model, CpuVecFusedMlp.fits, CpuVecFusedMlp)
        set_linear_method(model, CpuVecGemm())
    elif config.enabled("onednn_gemm") and device.type == "cpu" and cpu_has_onednn_gemm(dtype):
        # Measured before anything is packed; the MLPs first, so that the linear method does not pack
        # their gate_up a second time.
        float32 = (CpuFloat32Gemm.measured_on(model)
                   if config.enabled("cpu_float32_gemm") and dtype != torch.float32 else None)
        plain_from_rows = float32_plain_from_rows(model) if dtype == torch.float32 else None
        single_row = (config.enabled("single_row_vec_gemm") and single_row_vec_gemm.applies(dtype)
                      and cpu_vec_gemm.fits(model) and cpu_vec_gemm.load() and SingleRowVecGemm.measured_on(model))
        if config.enabled("onednn_fused_mlp"):
            if single_row and config.enabled("cpu_vec_fused_mlp"):  # then oneDNN's for any MLP the vec op cannot take
                _swap_mlps(model, SingleRowVecFusedMlp.fits,
                           lambda mlp: SingleRowVecFusedMlp(mlp, OnednnFusedMlp(mlp, float32, plain_from_rows)))
            _swap_mlps(model, OnednnFusedMlp.fits, lambda mlp: OnednnFusedMlp(mlp, float32, plain_from_rows))
        method = OnednnGemm(float32, plain_from_rows)
        set_linear_method(model, SingleRowVecGemm(method) if single_row else method)

    # The element-wise chains: C++ ops on CPU, torch.compile on CUDA; each swapped in for the plain function.
    cpu_ops = ({rms_norm: cpu_norm_act.rms_norm, silu_and_mul: cpu_norm_act.silu_and_mul, rotate: cpu_norm_act.rotate}
               if device.type == "cpu" and config.enabled("cpu_norm_act") and cpu_norm_act.load() else {})
    compile_norm_act = device.type == "cuda" and config.enabled("compiled_norm_act")

    rope_caches: list[RopeCache] = []
    for module in list(model.modules()):
        rope = getattr(module, "rotary_emb", None)
        if config.enabled("rope_cache") and isinstance(rope, RotaryEmbedding):
            cache = next((c for c in rope_caches if c.serves(rope)), None)
            if cache is None:
                cache = RopeCache(rope)
                rope_caches.append(cache)
            module.rotary_emb = cache
        if isinstance(module, (RMSNorm, SiluAndMul, RotaryEmbedding)):
            if module.op in cpu_ops:
                module.op = cpu_ops[module.op]
            elif compile_norm_act:
                module.op = CompiledNormAct(module.op)


def _swap_mlps(model: nn.Module, fits, make) -> None:
    """Replace every submodule of ``model`` that ``fits`` with ``make(submodule)``."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if fits(child):
                setattr(parent, name, make(child))
