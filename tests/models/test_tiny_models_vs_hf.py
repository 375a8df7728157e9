"""Tiny random Llama (llama3 RoPE, tied), Qwen2 (qkv bias, sharded) and Qwen3 (q/k norm) checkpoints:
greedy tokens equal transformers' generate, through the whole engine."""

from __future__ import annotations

import random

import pytest
import torch

from tracevllm import LLM, SamplingParams


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_matches_transformers(tiny_checkpoint, arch):
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoint(arch)
    rng = random.Random(arch)
    prompts = [[rng.randrange(3, 49152) for _ in range(n)] for n in (1, 7, 33, 120)]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    hf.generation_config.eos_token_id = None  # ignore_eos: EOS may appear but does not stop
    expected = []
    with torch.inference_mode():
        for ids in prompts:
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              do_sample=False, max_new_tokens=24, pad_token_id=0)
            expected.append(out[0, len(ids):].tolist())

    llm = LLM(model=path, dtype="float32", block_size=16, max_num_batched_tokens=64, max_num_seqs=4)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_logprobs_close_to_float32_reference(tiny_checkpoint, dtype):
    """bf16/fp16 runs end to end and its logprobs stay within half-precision error of float32."""
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoint("qwen3")
    prompt = list(range(1000, 1040))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    llm = LLM(model=path, dtype=dtype)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    with torch.inference_mode():
        ref = hf(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    for pos, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert lp[token].logprob == pytest.approx(ref[pos, token].item(), abs=0.15)
        assert ref[pos, token] >= ref[pos].max() - 0.3  # a near-top token under float32 too


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_triton_backend_greedy_equals_torch_backend(tiny_checkpoint, arch):
    """The Triton kernels (interpreted on a CPU) inside the whole engine, with chunked prefill
    (a 32-token budget), prefix-cache hits on a shared 40-token prefix, mixed batches, GQA,
    head_dim 16 (llama) and 32 (qwen3) and a sliding window (mistral)."""
    pytest.importorskip("triton")
    path = tiny_checkpoint(arch)
    rng = random.Random(f"triton-{arch}")
    shared = [rng.randrange(3, 49152) for _ in range(40)]
    prompts = [shared + [rng.randrange(3, 49152) for _ in range(n)] for n in (30, 1, 9)]
    prompts.append([rng.randrange(3, 49152) for _ in range(5)])
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine_args = dict(model=path, dtype="float32", block_size=16, max_num_batched_tokens=32, max_num_seqs=4,
                       enable_prefix_caching=True)

    def run(backend: str):
        llm = LLM(**engine_args, attention_backend=backend)
        first = llm.generate(prompts[:1], params, use_tqdm=False)  # fills the prefix cache
        rest = llm.generate(prompts[1:], params, use_tqdm=False)
        return first + rest

    expected, got = run("torch"), run("triton")
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert [o.num_cached_tokens for o in got[1:3]] == [32, 32]  # two full blocks of the shared prefix
