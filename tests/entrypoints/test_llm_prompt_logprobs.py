"""``SamplingParams.prompt_logprobs`` end to end on the bundled model, against transformers' own
log-softmax over the same prompt (float32): values, ranks and top-k, through chunked prefill, a
prefix cache that must not be used, preemption, n > 1 and DELTA outputs."""

from __future__ import annotations

import pytest
import torch

from tracevllm import LLM, SamplingParams
from tracevllm.sampling_params import RequestOutputKind

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is Paris, the capital of Italy is Rome, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Hello",
]
K = 3
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=K)


@pytest.fixture(scope="module")
def hf_logprobs(bundled_model_dir):
    """Per prompt: transformers' ``[len - 1, vocab]`` logprobs of positions 1.. given the prefix."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    result = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        with torch.no_grad():
            result.append((ids, model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)))
    return result


def assert_matches_transformers(output, ids, reference):
    prompt_logprobs = output.prompt_logprobs
    assert output.prompt_token_ids == ids
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for position, (token_id, expected) in enumerate(zip(ids[1:], reference), start=1):
        entry = prompt_logprobs[position]
        assert entry[token_id].logprob == pytest.approx(expected[token_id].item(), abs=1e-4)
        assert entry[token_id].rank == int((expected > expected[token_id]).sum()) + 1
        top = expected.topk(K)
        for rank, (top_id, value) in enumerate(zip(top.indices.tolist(), top.values.tolist()), start=1):
            if top_id != token_id:
                assert entry[top_id].rank == rank and entry[top_id].logprob == pytest.approx(value, abs=1e-4)
        assert set(entry) <= {token_id, *top.indices.tolist()}
        assert entry[token_id].decoded_token is not None


def test_prompt_logprobs_match_transformers(bundled_model_dir, hf_logprobs):
    llm = LLM(dtype="float32", max_model_len=512)
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    for output, (ids, reference) in zip(outputs, hf_logprobs):
        assert_matches_transformers(output, ids, reference)
    assert PROMPTS[2] == "Hello" and outputs[2].prompt_logprobs == [None]  # one token: nothing predicts it
    plain = llm.generate(PROMPTS[0], PARAMS.clone(prompt_logprobs=None), use_tqdm=False)[0]
    assert plain.prompt_logprobs is None
    assert plain.outputs[0].token_ids == outputs[0].outputs[0].token_ids


def test_chunked_prefill_preemption_and_prefix_cache(bundled_model_dir, hf_logprobs):
    # 8-token chunks split every prompt over several steps; 6 blocks of 16 tokens (7 with the null block)
    # for ~35 prompt tokens and 3 x 20 generated force preemption.
    llm = LLM(dtype="float32", max_model_len=96, max_num_batched_tokens=8, max_num_seqs=4, num_gpu_blocks_override=7,
              enable_prefix_caching=True)
    params = PARAMS.clone(max_tokens=20)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    for output, (ids, reference) in zip(outputs, hf_logprobs):
        assert_matches_transformers(output, ids, reference)
    # The first prompt's blocks are cached now: a request that wants prompt logprobs must not use
    # them (it needs every position's logits), one that does not, does.
    again = llm.generate(PROMPTS[0], params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0
    assert_matches_transformers(again, *hf_logprobs[0])
    assert llm.generate(PROMPTS[0], params.clone(prompt_logprobs=None), use_tqdm=False)[0].num_cached_tokens > 0
    kv = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
    runner = llm.llm_engine.engine_core.engine_core.model_executor.worker.model_runner
    assert kv.num_free_blocks == 6
    assert not runner.prompt_logprobs.num_logprobs and not runner.prompt_logprobs.in_progress


def test_n_samples_and_delta_outputs_carry_them_once(bundled_model_dir, hf_logprobs):
    from tracevllm.engine.llm_engine import LLMEngine

    llm = LLM(dtype="float32", max_model_len=512)
    both = llm.generate(PROMPTS[0], PARAMS.clone(n=2, temperature=1.0, seed=1), use_tqdm=False)[0]
    assert len(both.outputs) == 2
    assert_matches_transformers(both, *hf_logprobs[0])

    engine: LLMEngine = llm.llm_engine
    engine.add_request("delta", PROMPTS[1], PARAMS.clone(output_kind=RequestOutputKind.DELTA))
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    assert len(deltas) == PARAMS.max_tokens
    assert deltas[0].prompt_logprobs is not None and all(d.prompt_logprobs is None for d in deltas[1:])
    assert_matches_transformers(deltas[0], *hf_logprobs[1])


def test_bad_values_are_refused(bundled_model_dir):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
    llm = LLM(dtype="float32", max_model_len=128)
    for field in ("prompt_logprobs", "logprobs"):
        with pytest.raises(ValueError, match=f"{field} must be at most 20"):
            llm.generate("Hi", SamplingParams(**{field: 21}), use_tqdm=False)
    assert llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
