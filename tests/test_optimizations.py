"""The switchable optimisations (tracevllm/optimizations.py): each one is on by default, can be
turned off by name, and changes speed only: the tokens and logprobs stay those of the plain code."""

from __future__ import annotations

import pytest
import torch

from tracevllm import LLM, SamplingParams
from tracevllm.attention.backends.cpu_attn import CPUAttentionBackend, choose_cpu_attention_ops
from tracevllm.attention.backends.torch_attn import TorchAttentionBackend
from tracevllm.attention.layer import Attention
from tracevllm.attention.ops import cpu_amx_decode, cpu_amx_prefill, cpu_vec_decode
from tracevllm.attention.selector import get_attn_backend
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.layers.activation import SiluAndMul
from tracevllm.layers import cpu_norm_act, cpu_vec_gemm, single_row_vec_gemm
from tracevllm.layers.layernorm import RMSNorm
from tracevllm.layers.cpu_gemm import UpcastWeightsLinearMethod, OnednnFusedMlp, OnednnGemm, cpu_has_onednn_gemm
from tracevllm.layers.cpu_vec_gemm import CpuVecFusedMlp, CpuVecGemm
from tracevllm.layers.linear import LinearBase, MergedColumnParallelLinear, UnquantizedLinearMethod
from tracevllm.layers.rope_cache import RopeCache
from tracevllm.layers.rotary_embedding import RotaryEmbedding
from tracevllm.layers.single_row_vec_gemm import SingleRowVecFusedMlp, SingleRowVecGemm
from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead
from tracevllm.models.llama import LlamaMLP
from tracevllm.models.loader import load_model
from tracevllm.optimizations import DISABLE_ENV, OPTIMIZATIONS, OptimizationConfig

PROMPTS = [[5, 17, 99, 3, 250, 11, 42], list(range(300, 460)), [7] * 40]  # the second one >= 128 tokens


def test_names_all_and_unknown(monkeypatch):
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    assert OptimizationConfig.from_names().disabled == frozenset()
    assert OptimizationConfig.from_names(["all"]).disabled == frozenset(OPTIMIZATIONS)
    assert not OptimizationConfig.from_names(["onednn_gemm"]).enabled("onednn_gemm")
    with pytest.raises(ValueError, match="Unknown optimization"):
        OptimizationConfig.from_names(["onednn"])
    monkeypatch.setenv(DISABLE_ENV, "rope_cache, decode_plan")
    assert OptimizationConfig.from_names().disabled == {"rope_cache", "decode_plan"}
    assert OptimizationConfig.from_names([]).disabled == frozenset()  # an explicit list wins


def test_engine_option_and_cli_flag():
    import argparse

    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--disable-optimizations", "onednn_gemm", "cpu_norm_act"])
    assert EngineArgs.from_cli_args(args).disable_optimizations == ["onednn_gemm", "cpu_norm_act"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--disable-optimizations", "nope"])


def _load(model_dir: str, dtype: torch.dtype, disabled: list[str]):
    return load_model(model_dir, dtype, torch.device("cpu"), get_attn_backend("torch", torch.device("cpu")),
                      OptimizationConfig.from_names(disabled))


def _attention_ops(model_dir: str, disabled: list[str], block_size: int = 16):
    """The ops the cpu backend chooses for this model in bf16 (as the runner's builder does at start-up)."""
    impl = next(m.impl for m in _load(model_dir, torch.bfloat16, ["all"]).modules() if isinstance(m, Attention))
    return choose_cpu_attention_ops(impl, torch.bfloat16, block_size, OptimizationConfig.from_names(disabled))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_modules_switched(tiny_checkpoint, arch):
    on, off = _load(tiny_checkpoint(arch), torch.bfloat16, []), _load(tiny_checkpoint(arch), torch.bfloat16, ["all"])
    ropes_on = {id(layer.self_attn.rotary_emb) for layer in on.model.layers}
    ropes_off = {id(layer.self_attn.rotary_emb) for layer in off.model.layers}
    assert len(ropes_on) == 1 and len(ropes_off) == len(off.model.layers)
    assert isinstance(on.model.layers[0].self_attn.rotary_emb, RopeCache)
    # On CPU the element-wise chains are the C++ ops (torch.compile is for CUDA).
    cpp_ops = {cpu_norm_act.rms_norm, cpu_norm_act.silu_and_mul, cpu_norm_act.rotate}
    for model, flag in ((on, cpu_norm_act.load()), (off, False)):
        assert all((m.op in cpp_ops) is flag
                   for m in model.modules() if isinstance(m, (RMSNorm, SiluAndMul, RotaryEmbedding)))
    # Attention is chosen by the selector (and the cpu backend's ops at start-up); nothing is switched on a layer.
    impls_on, impls_off = ([vars(m.impl) for m in model.modules() if isinstance(m, Attention)] for model in (on, off))
    assert impls_on and impls_on == impls_off
    cpu = torch.device("cpu")
    assert get_attn_backend(None, cpu, OptimizationConfig.from_names([])) is CPUAttentionBackend
    assert get_attn_backend(None, cpu, OptimizationConfig.from_names(["all"])) is TorchAttentionBackend
    assert _attention_ops(tiny_checkpoint(arch), []).decode != "sdpa"  # head_dim 16 and 32: both supported
    # The GEMMs (layers/cpu_gemm.py): one method for every linear layer and the LM head, and the MLPs.
    linears_on, linears_off = ([m for m in model.modules() if isinstance(m, (LinearBase, ParallelLMHead))]
                               for model in (on, off))
    plain = UpcastWeightsLinearMethod if not cpu_has_onednn_gemm(torch.bfloat16) else UnquantizedLinearMethod
    assert all(type(m.linear_method) is plain for m in linears_off)
    assert all(isinstance(layer.mlp, LlamaMLP) for layer in off.model.layers)
    if cpu_vec_gemm.applies(torch.bfloat16) and cpu_vec_gemm.load():  # AVX512-BF16, no AMX: our own op
        method = on.lm_head.linear_method
        assert isinstance(method, CpuVecGemm) and all(m.linear_method is method for m in linears_on)
        assert all(m.weight is None for m in linears_on if isinstance(m, LinearBase))
        assert on.lm_head.weight is not None
        assert all(isinstance(layer.mlp, CpuVecFusedMlp) for layer in on.model.layers)
        assert not any(isinstance(m, MergedColumnParallelLinear) for m in on.modules())
        # Without it, oneDNN's method and fused MLP serve the same model.
        onednn = _load(tiny_checkpoint(arch), torch.bfloat16, ["cpu_vec_gemm"])
        assert isinstance(onednn.lm_head.linear_method, OnednnGemm)
        assert all(isinstance(layer.mlp, OnednnFusedMlp) for layer in onednn.model.layers)
        unfused = _load(tiny_checkpoint(arch), torch.bfloat16, ["cpu_vec_fused_mlp"])
        assert isinstance(unfused.lm_head.linear_method, CpuVecGemm)
        assert all(isinstance(layer.mlp, LlamaMLP) for layer in unfused.model.layers)
    elif cpu_has_onednn_gemm(torch.bfloat16):
        method = on.lm_head.linear_method
        assert all(m.linear_method is method for m in linears_on)
        # single_row_vec_gemm (AMX, where measured faster at load): oneDNN's method and MLP inside the switch's
        single_row = isinstance(method, SingleRowVecGemm)
        assert not single_row or single_row_vec_gemm.applies(torch.bfloat16)
        onednn = method.large if single_row else method
        mlps = [layer.mlp.large if single_row else layer.mlp for layer in on.model.layers]
        assert isinstance(onednn, OnednnGemm)
        assert all(isinstance(layer.mlp, SingleRowVecFusedMlp) is single_row for layer in on.model.layers)
        assert all(hasattr(m, "vec_packed_weight") is single_row for m in linears_on)
        assert all(m.weight is None for m in linears_on if isinstance(m, LinearBase))  # the plain copy is dropped
        assert on.lm_head.weight is not None  # tied to the embedding: kept
        # onednn_fused_mlp: gate and up packed apart, and not packed a second time as one matrix
        assert all(isinstance(mlp, OnednnFusedMlp) for mlp in mlps)
        assert not any(isinstance(m, MergedColumnParallelLinear) for m in on.modules())
        # cpu_float32_gemm: float32 copies for every packed GEMM alike, or for none, as measured on this CPU
        copies = [m.packed_weight_float32 for m in linears_on] if onednn.float32 is not None else []
        copies += [c for mlp in mlps for c in mlp.packed_gate_up_float32 or ()]
        assert all(c.dtype == torch.float32 for c in copies)
        assert len(copies) in (0, len(linears_on) + 2 * len(on.model.layers))
    else:
        assert all(type(m.linear_method) is plain for m in linears_on)
        assert all(isinstance(layer.mlp, LlamaMLP) for layer in on.model.layers)


def _generate(model_dir: str, dtype: str, disabled: list[str]):
    llm = LLM(model=model_dir, dtype=dtype, disable_optimizations=disabled, max_num_batched_tokens=256)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.llm_engine.shutdown()
    return outputs


# What no float32 engine on a CPU runs, whatever the CPU: the AMX/AVX512-BF16 attention ops and GEMMs
# take bf16 only (their ``supports`` and ``applies``), cpu_float32_gemm is a float32 copy of bf16/fp16
# weights, and the other two run on CUDA only. Turning one off builds the engine that all-on builds, so
# the test skips it.
NOT_IN_FLOAT32_ON_CPU = {"cpu_amx_decode", "cpu_vec_decode", "cpu_amx_prefill", "cpu_vec_prefill", "cpu_float32_gemm",
                         "cpu_vec_gemm", "cpu_vec_fused_mlp", "single_row_vec_gemm", "compiled_norm_act", "cuda_graphs"}


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_float32_tokens_equal_with_each_optimization_off(tiny_checkpoint, arch):
    """float32 (the token-exact tests' dtype): all on, each one off, and all off give the same
    greedy tokens, and logprobs within float32 rounding."""
    assert not any(op.supports(8, 8, 64, torch.float32) for op in (cpu_amx_decode, cpu_vec_decode))
    assert not cpu_vec_gemm.applies(torch.float32) and not single_row_vec_gemm.applies(torch.float32)
    assert not any(cpu_amx_prefill.supports(64, torch.float32, amx) for amx in (True, False))
    model_dir = tiny_checkpoint(arch)
    reference = _generate(model_dir, "float32", ["all"])
    for disabled in ([], *([name] for name in OPTIMIZATIONS if name not in NOT_IN_FLOAT32_ON_CPU)):
        outputs = _generate(model_dir, "float32", disabled)
        for out, ref in zip(outputs, reference):
            assert out.outputs[0].token_ids == ref.outputs[0].token_ids, disabled
            for lp, ref_lp in zip(out.outputs[0].logprobs, ref.outputs[0].logprobs):
                for token_id, logprob in ref_lp.items():
                    assert lp[token_id].logprob == pytest.approx(logprob.logprob, abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_onednn_objects_serve_float32_and_keep_the_tokens(tiny_checkpoint, arch):
    """oneDNN runs float32 on any x86 CPU, so a float32 model on a CPU gets the oneDNN linear method
    and fused MLP (and no float32 copies: its weights are float32 already): the same greedy tokens
    as the plain model, and logprobs within float32 rounding (the packed GEMM sums in another
    order). Qwen2's q/k/v biases take the bias path."""
    model = _load(tiny_checkpoint(arch), torch.float32, [])
    assert isinstance(model.lm_head.linear_method, OnednnGemm) and model.lm_head.linear_method.float32 is None
    assert all(isinstance(layer.mlp, OnednnFusedMlp) for layer in model.model.layers)
    plain, fast = _generate(tiny_checkpoint(arch), "float32", ["all"]), _generate(tiny_checkpoint(arch), "float32", [])
    for out, ref in zip(fast, plain):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        for lp, ref_lp in zip(out.outputs[0].logprobs, ref.outputs[0].logprobs):
            for token_id, logprob in ref_lp.items():
                assert lp[token_id].logprob == pytest.approx(logprob.logprob, abs=1e-4)


def test_bfloat16_close_to_plain(tiny_checkpoint):
    """bf16 (where onednn_gemm and the compiled element-wise code run): the prompt logprobs of the
    optimised engine stay close to the plain one's. Only onednn_fused_mlp changes them at all here
    (its SiLU is not rounded to bf16 before the product: about one bf16 step in the MLP's output);
    oneDNN's packed GEMM and F.linear round alike, and the compiled code rounds where the eager
    code does."""
    model_dir = tiny_checkpoint("llama")
    plain, fast = _generate(model_dir, "bfloat16", ["all"]), _generate(model_dir, "bfloat16", [])
    for out, ref in zip(fast, plain):
        for lp, ref_lp in zip(out.prompt_logprobs[1:], ref.prompt_logprobs[1:]):
            for token_id, logprob in ref_lp.items():
                if token_id in lp:
                    assert lp[token_id].logprob == pytest.approx(logprob.logprob, abs=0.1)


@pytest.mark.skipif(not (single_row_vec_gemm.applies(torch.bfloat16) and cpu_vec_gemm.load()),
                    reason="needs a CPU with AMX tiles and AVX512-BF16, and a C++ compiler")
def test_single_row_vec_gemm_swapped_in_and_close(tiny_checkpoint, monkeypatch):
    """On an AMX CPU, with the load-time measurement made to say yes (it decides by timing, which a
    tiny model cannot show): every GEMM and MLP takes its single rows to the vec op, and one sequence's
    bf16 logprobs, all its decode steps single rows, stay within a bf16 step's effect of oneDNN's."""
    monkeypatch.setattr(SingleRowVecGemm, "measured_on", staticmethod(lambda model: True))
    model_dir = tiny_checkpoint("llama")
    model = _load(model_dir, torch.bfloat16, [])
    assert all(isinstance(m.linear_method, SingleRowVecGemm) for m in model.modules()
               if isinstance(m, (LinearBase, ParallelLMHead)))
    assert all(isinstance(layer.mlp, SingleRowVecFusedMlp) for layer in model.model.layers)
    unfused = _load(model_dir, torch.bfloat16, ["cpu_vec_fused_mlp"])
    assert isinstance(unfused.lm_head.linear_method, SingleRowVecGemm)
    assert all(isinstance(layer.mlp, OnednnFusedMlp) for layer in unfused.model.layers)

    def generate(disabled: list[str]):
        llm = LLM(model=model_dir, dtype="bfloat16", disable_optimizations=disabled)
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
        out = llm.generate([PROMPTS[1]], params, use_tqdm=False)[0].outputs[0]
        llm.llm_engine.shutdown()
        return out

    on, off = generate([]), generate(["single_row_vec_gemm"])
    for lp, ref_lp in zip(on.logprobs, off.logprobs):
        for token_id, logprob in ref_lp.items():
            if token_id in lp:
                assert lp[token_id].logprob == pytest.approx(logprob.logprob, abs=0.1)


def test_amx_prefill_switched_and_close_to_sdpa(tiny_checkpoint):
    """cpu_amx_prefill (a CPU with AMX) or cpu_vec_prefill (AVX512-BF16 without AMX) take head sizes
    from 64 (the tiny models' 16 and 32 are too small): with 4 heads of 64, bf16 prompt logprobs
    through the prefill op stay close to those through SDPA. Both round the probabilities to bf16, in
    different places; measured with AMX: median 0.008 apart, at most 0.12 (onednn_fused_mlp alone
    moves them by up to 0.23)."""
    model_dir = tiny_checkpoint("llama", hidden_size=256)
    amx, vec = cpu_amx_prefill.supports(64, torch.bfloat16), cpu_amx_prefill.supports(64, torch.bfloat16, amx=False)
    switch = "cpu_amx_prefill" if amx else "cpu_vec_prefill"
    expected = {(): switch if amx or vec else "sdpa", (switch,): "sdpa",
                ("cpu_vec_prefill",): "cpu_amx_prefill" if amx else "sdpa"}  # a CPU with tiles: on them, or SDPA
    for disabled, op in expected.items():
        assert _attention_ops(model_dir, list(disabled)).prefill == op, disabled
    if not (amx or vec):
        pytest.skip("this CPU has neither AMX tiles nor AVX512-BF16")
    sdpa, op = _generate(model_dir, "bfloat16", [switch]), _generate(model_dir, "bfloat16", [])
    gaps = [abs(lp[token_id].logprob - logprob.logprob)
            for out, ref in zip(op, sdpa) for lp, ref_lp in zip(out.prompt_logprobs[1:], ref.prompt_logprobs[1:])
            for token_id, logprob in ref_lp.items() if token_id in lp]
    assert len(gaps) > 300 and max(gaps) < 0.25 and sorted(gaps)[len(gaps) // 2] < 0.02


def test_amx_decode_switched_and_close_to_float32_op(tiny_checkpoint):
    """cpu_amx_decode, like cpu_amx_prefill, takes head sizes from 64: with 4 heads of 64, the bf16
    logprobs of the generated tokens through it stay close to those through the float32 decode op
    (which rounds nothing to bf16 inside), up to the first token where the two pick differently.
    Measured here: 71 logprobs, median 0.012 apart, at most 0.12."""
    model_dir = tiny_checkpoint("llama", hidden_size=256)
    supported = cpu_amx_decode.supports(4, 4, 64, torch.bfloat16)
    for disabled, flag in (([], supported), (["cpu_amx_decode"], False), (["cpu_paged_decode"], False)):
        assert (_attention_ops(model_dir, disabled).decode == "cpu_amx_decode") is flag, disabled
    if not supported:
        pytest.skip("this CPU has no AMX tiles")
    vector, amx = _generate(model_dir, "bfloat16", ["cpu_amx_decode"]), _generate(model_dir, "bfloat16", [])
    gaps = []
    for out, ref in zip(amx, vector):
        for token, ref_token, lp, ref_lp in zip(out.outputs[0].token_ids, ref.outputs[0].token_ids,
                                                out.outputs[0].logprobs, ref.outputs[0].logprobs):
            gaps += [abs(lp[t].logprob - logprob.logprob) for t, logprob in ref_lp.items() if t in lp]
            if token != ref_token:
                break
    assert len(gaps) > 40 and max(gaps) < 0.25 and sorted(gaps)[len(gaps) // 2] < 0.02
