"""The LLM API on the bundled model: sampling, n, stops, logprobs, aborts and bad input."""

from __future__ import annotations

import json

import pytest
import torch

from tracevllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "The three most important ideas in computer science are"


@pytest.fixture(scope="module")
def llm(bundled_model_dir):
    return LLM(dtype="float32", max_model_len=1024)


def token_ids(outputs):
    return [c.token_ids for o in outputs for c in o.outputs]


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate(PROMPT, params, use_tqdm=False)
    again = llm.generate(PROMPT, params, use_tqdm=False)
    crowd = llm.generate(
        [PROMPT, "Hello", "Another prompt entirely"],
        [params, SamplingParams(temperature=1.0, max_tokens=30), SamplingParams(temperature=0.7, max_tokens=5)],
        use_tqdm=False,
    )
    other_seed = llm.generate(PROMPT, params.clone(seed=99), use_tqdm=False)
    assert token_ids(alone) == token_ids(again) == token_ids(crowd[:1])
    assert token_ids(alone) != token_ids(other_seed)


def test_n_gives_n_outputs(llm):
    out = llm.generate(PROMPT, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)
    assert len(out) == 1 and [c.index for c in out[0].outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 12 for c in out[0].outputs)
    assert len({tuple(c.token_ids) for c in out[0].outputs}) > 1


def test_max_tokens_and_min_tokens(llm):
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True), use_tqdm=False)
    first = out[0].outputs[0].token_ids[0]
    assert len(out[0].outputs[0].token_ids) == 7
    # The greedy first token is a stop token, but min_tokens bans it until 3 tokens exist.
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, min_tokens=3, stop_token_ids=[first]),
                       use_tqdm=False)
    ids = out[0].outputs[0].token_ids
    assert len(ids) >= 3 and first not in ids[:3]
    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[first]), use_tqdm=False)
    assert plain[0].outputs[0].token_ids == [first]
    assert plain[0].outputs[0].finish_reason == "stop" and plain[0].outputs[0].stop_reason == first


def test_stop_strings_cut_the_text(llm):
    ref = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    text = ref[0].outputs[0].text
    words = text.split()
    stop = words[len(words) // 2]
    cut = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=[stop]), use_tqdm=False)[0]
    assert cut.outputs[0].text == text[: text.index(stop)]
    assert cut.outputs[0].finish_reason == "stop" and cut.outputs[0].stop_reason == stop
    kept = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=stop, include_stop_str_in_output=True),
                        use_tqdm=False)[0]
    assert kept.outputs[0].text == text[: text.index(stop) + len(stop)]


def test_logprobs_equal_log_softmax_of_model_logits(llm, bundled_model_dir):
    from transformers import AutoModelForCausalLM

    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6, logprobs=5, ignore_eos=True),
                       use_tqdm=False)[0]
    completion = out.outputs[0]
    hf = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32, local_files_only=True)
    ids = out.prompt_token_ids + completion.token_ids
    with torch.inference_mode():
        logits = hf(torch.tensor([ids])).logits[0].float()
    ref = torch.log_softmax(logits[len(out.prompt_token_ids) - 1 : -1], dim=-1)
    assert len(completion.logprobs) == 6
    total = 0.0
    for pos, (tok, lp) in enumerate(zip(completion.token_ids, completion.logprobs)):
        assert lp[tok].rank == 1  # greedy picks the most likely token
        assert lp[tok].logprob == pytest.approx(ref[pos, tok].item(), abs=1e-4)
        top5 = torch.topk(ref[pos], 5).indices.tolist()
        assert set(top5) <= set(lp)
        for t in top5:
            assert lp[t].logprob == pytest.approx(ref[pos, t].item(), abs=1e-4)
        total += lp[tok].logprob
    assert completion.cumulative_logprob == pytest.approx(total)


def test_abort_frees_every_block(llm):
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"abort-{i}", PROMPT + f" ({i})", params)
    engine.step()
    engine.step()
    engine.abort_request("abort-1")
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert sorted(finished) == ["abort-0", "abort-2"]
    kv = engine.engine_core.engine_core.scheduler.kv_cache_manager
    assert kv.num_free_blocks == engine.vllm_config.cache_config.num_gpu_blocks - 1  # all but the null block


@pytest.mark.parametrize(
    "prompt, params, match",
    [
        ("", SamplingParams(), "empty"),
        ("word " * 1100, SamplingParams(), "max_model_len"),
        (PROMPT, dict(max_tokens=0), "max_tokens"),
        (PROMPT, dict(temperature=-0.5), "temperature"),
        (PROMPT, dict(top_p=0.0), "top_p"),
        (PROMPT, dict(top_p=1.5), "top_p"),
        (PROMPT, dict(top_k=-2), "top_k"),
        (PROMPT, dict(top_k=0), "top_k"),
    ],
)
def test_bad_input_raises_value_error_and_engine_keeps_serving(llm, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([PROMPT, prompt], SamplingParams(**params) if isinstance(params, dict) else params,
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()  # nothing was queued, not even the good prompt
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_unknown_model_and_unsupported_architecture(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        LLM(model=str(tmp_path / "no-such-model"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "llama"}))
    with pytest.raises(ValueError, match="FooForCausalLM"):
        LLM(model=str(tmp_path))


def test_chat_matches_generate_on_the_template(llm):
    messages = [{"role": "user", "content": "Say hello in French."}]
    params = SamplingParams(temperature=0, max_tokens=10)
    chat = llm.chat(messages, params, use_tqdm=False)[0]
    prompt = llm.get_tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat.outputs[0].token_ids == llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids


def test_chat_does_not_add_a_second_bos(tiny_checkpoint, tmp_path):
    """A tokenizer that adds BOS on encode, under a template that writes BOS itself: chat() must give
    exactly the ids of transformers' own chat tokenization, with one BOS."""
    import shutil

    from transformers import AutoTokenizer

    model_dir = shutil.copytree(tiny_checkpoint("llama"), tmp_path / "llama-bos")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, add_bos_token=True)
    tokenizer.save_pretrained(model_dir)
    messages = [{"role": "user", "content": "Say hello in French."}]
    expected = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert expected[0] == tokenizer.bos_token_id != expected[1]
    llm = LLM(model=str(model_dir), dtype="float32", max_model_len=256)
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert out.prompt_token_ids == expected
    text_prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt == text_prompt
    plain = llm.generate(text_prompt, SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert plain.prompt_token_ids == [tokenizer.bos_token_id] + expected  # generate() adds one, as encode does
