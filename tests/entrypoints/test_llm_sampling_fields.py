"""vLLM's SamplingParams fields beyond the basics, end to end on the bundled model: detokenize,
bad_words (against transformers' bad_words_ids), truncate_prompt_tokens, spaces_between_special_tokens."""

from __future__ import annotations

import pytest
import torch

from tracevllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(bundled_model_dir):
    return LLM(dtype="float32", max_model_len=512)


@pytest.fixture(scope="module")
def hf_model(bundled_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32, local_files_only=True).eval()


def hf_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=max_new_tokens,
                                pad_token_id=0, eos_token_id=None, **kwargs)
    return out[0, len(prompt_ids):].tolist()


def test_detokenize_false_gives_the_same_tokens_and_no_text(llm):
    plain = llm.generate(PROMPT, GREEDY.clone(logprobs=2), use_tqdm=False)[0].outputs[0]
    raw = llm.generate(PROMPT, GREEDY.clone(logprobs=2, detokenize=False), use_tqdm=False)[0].outputs[0]
    assert plain.text and raw.text == ""
    assert raw.token_ids == plain.token_ids
    assert [{t: lp.logprob for t, lp in pos.items()} for pos in raw.logprobs] == \
        [{t: lp.logprob for t, lp in pos.items()} for pos in plain.logprobs]
    assert all(lp.decoded_token is None for pos in raw.logprobs for lp in pos.values())
    assert all(lp.decoded_token is not None for pos in plain.logprobs for lp in pos.values())


def test_bad_words_match_transformers_bad_words_ids(llm, hf_model):
    tokenizer = llm.get_tokenizer()
    plain = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0]
    assert "Paris" in plain.outputs[0].text  # so that banning it changes something
    # One word of one token, and one of several tokens (banned only once its prefix is generated).
    bad_words = ["Paris", " capital of"]
    sequences = llm.llm_engine.processor._bad_words_token_ids(bad_words)
    assert any(len(s) > 1 for s in sequences)
    out = llm.generate(PROMPT, GREEDY.clone(bad_words=bad_words), use_tqdm=False)[0].outputs[0]
    assert "Paris" not in out.text and " capital of" not in out.text
    # transformers bans the same sequences; its prefix check also looks into the prompt, which does
    # not end with any of these prefixes, so the two rules agree here.
    prompt_ids = tokenizer.encode(PROMPT)
    assert out.token_ids == hf_greedy(hf_model, prompt_ids, GREEDY.max_tokens, bad_words_ids=sequences)
    assert out.token_ids != plain.outputs[0].token_ids


def test_bad_words_sequences_as_vllm_builds_them(llm):
    tokenizer = llm.get_tokenizer()
    sequences = llm.llm_engine.processor._bad_words_token_ids(["Paris"])
    # "Paris" at the start of a text and " Paris" in the middle are different single tokens.
    assert sequences == [tokenizer.encode("Paris", add_special_tokens=False),
                         tokenizer.encode(" Paris", add_special_tokens=False)]


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    ids = llm.get_tokenizer().encode("One two three four five six seven eight nine ten")
    out = llm.generate({"prompt_token_ids": ids}, GREEDY.clone(truncate_prompt_tokens=4), use_tqdm=False)[0]
    assert out.prompt_token_ids == ids[-4:]
    assert out.outputs[0].token_ids == llm.generate(ids[-4:], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    text = llm.generate("One two three four five six seven eight nine ten", GREEDY.clone(truncate_prompt_tokens=4),
                        use_tqdm=False)[0]
    assert text.prompt_token_ids == ids[-4:]
    longer = llm.generate(ids, GREEDY.clone(truncate_prompt_tokens=100), use_tqdm=False)[0]
    assert longer.prompt_token_ids == ids
    # -1: as many as fit, so a prompt longer than max_model_len still runs (on its last 511 tokens).
    long_ids = (ids * 60)[:700]
    fit = llm.generate(long_ids, GREEDY.clone(truncate_prompt_tokens=-1, max_tokens=1), use_tqdm=False)[0]
    assert fit.prompt_token_ids == long_ids[-511:]
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(long_ids, GREEDY, use_tqdm=False)


def test_special_tokens_in_the_text_as_the_tokenizer_decodes(llm):
    """skip_special_tokens / spaces_between_special_tokens end to end: the text is transformers'
    decode of the same ids (the switch's effect is in tests/engine/test_detokenizer_special_spaces.py;
    this byte-level tokenizer puts no spaces between special tokens either way)."""
    tokenizer = llm.get_tokenizer()
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>"
    for skip in (True, False):
        for spaces in (True, False):
            params = GREEDY.clone(skip_special_tokens=skip, spaces_between_special_tokens=spaces, max_tokens=16)
            out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
            assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=skip)
