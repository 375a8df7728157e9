"""LLM.generate on vLLM's prompt forms (tracevllm/inputs): str, TextPrompt, TokensPrompt, token-id
lists, one or a list of them, mixed; a dict of neither form is a ValueError."""

from __future__ import annotations

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.inputs import TextPrompt, TokensPrompt

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(bundled_model_dir):
    return LLM(dtype="float32", max_model_len=512)


@pytest.fixture(scope="module")
def reference(llm):
    return llm.generate(PROMPT, GREEDY, use_tqdm=False)[0]


def test_text_prompt_generates_for_its_text(llm, reference):
    out = llm.generate({"prompt": PROMPT}, GREEDY, use_tqdm=False)
    assert len(out) == 1
    assert out[0].prompt == PROMPT and out[0].prompt_token_ids == reference.prompt_token_ids
    assert out[0].outputs[0].token_ids == reference.outputs[0].token_ids
    assert out[0].outputs[0].text == reference.outputs[0].text


def test_tokens_prompt_is_the_same_as_its_ids(llm, reference):
    ids = reference.prompt_token_ids
    out = llm.generate(TokensPrompt(prompt_token_ids=ids), GREEDY, use_tqdm=False)[0]
    assert out.prompt is None and out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == reference.outputs[0].token_ids
    assert llm.generate(ids, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == reference.outputs[0].token_ids
    named = llm.generate({"prompt_token_ids": ids, "prompt": PROMPT}, GREEDY, use_tqdm=False)[0]
    assert named.prompt == PROMPT  # the text given beside the ids is reported, not re-tokenized


def test_mixed_list_in_input_order(llm, reference):
    ids = reference.prompt_token_ids
    prompts = [PROMPT, TextPrompt(prompt="Hello"), {"prompt_token_ids": ids}, ids, "Hello"]
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in out]
    assert tokens[0] == tokens[2] == tokens[3] == reference.outputs[0].token_ids
    assert tokens[1] == tokens[4] != tokens[0]
    assert [o.prompt for o in out] == [PROMPT, "Hello", None, None, "Hello"]
    several = llm.generate([ids, ids[:3]], GREEDY, use_tqdm=False)  # a list of id lists is several prompts
    assert [o.prompt_token_ids for o in several] == [ids, ids[:3]]


@pytest.mark.parametrize("bad", [
    {"text": PROMPT}, [{"prompt": PROMPT}, {"input_ids": [1, 2]}], {"prompt_token_ids": "1 2 3"}, [1.5],
    "\ud800", [PROMPT, "x\udfff"],  # a lone surrogate: not the tokenizer's own error
])
def test_a_dict_of_neither_form_is_a_value_error_and_nothing_is_queued(llm, bad):
    with pytest.raises(ValueError):
        llm.generate(bad, GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
