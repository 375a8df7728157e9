"""LLM.chat: content parts, chat_template, add_generation_prompt and continue_final_message
(vLLM's semantics), all checked against transformers' own apply_chat_template."""

from __future__ import annotations

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.entrypoints.chat_utils import parse_chat_messages

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_tokens=6)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello in French."}]


@pytest.fixture(scope="module")
def llm(bundled_model_dir):
    return LLM(dtype="float32", max_model_len=512)


def hf_prompt(llm, messages, **kwargs) -> list[int]:
    text = llm.get_tokenizer().apply_chat_template(messages, tokenize=False, **kwargs)
    return llm.get_tokenizer().encode(text, add_special_tokens=False)


def test_content_parts_are_joined_like_the_server(llm):
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "Say hello"}, {"type": "text", "text": "in French."}]}]
    out = llm.chat(parts, GREEDY, use_tqdm=False)[0]
    joined = [MESSAGES[0], {"role": "user", "content": "Say hello\nin French."}]
    assert out.prompt_token_ids == hf_prompt(llm, joined, add_generation_prompt=True)
    assert out.outputs[0].token_ids == llm.chat(joined, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "Only text content parts"),
    ([{"role": "user", "content": [{"type": "text"}]}], "Only text content parts"),
    ([{"content": "no role"}], "'role'"),
    ([[]], "non-empty"),
    ([{"role": "user", "content": 5}], "content must be a string"),
    (None, "messages must be a conversation"),
    ("Hello", "messages must be a conversation"),
    ([{"role": "user", "content": "\ud800"}], "not valid Unicode"),
])
def test_bad_messages_are_value_errors(llm, messages, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False)


def test_parse_chat_messages_keeps_other_keys_and_none_content():
    assert parse_chat_messages([{"role": "assistant", "content": None, "name": "bot"}]) == \
        [{"role": "assistant", "content": "", "name": "bot"}]


def test_add_generation_prompt(llm):
    on = llm.chat(MESSAGES, GREEDY, use_tqdm=False)[0]
    off = llm.chat(MESSAGES, GREEDY, use_tqdm=False, add_generation_prompt=False)[0]
    assert on.prompt_token_ids == hf_prompt(llm, MESSAGES, add_generation_prompt=True)
    assert off.prompt_token_ids == hf_prompt(llm, MESSAGES, add_generation_prompt=False)
    assert on.prompt_token_ids != off.prompt_token_ids


def test_continue_final_message(llm):
    messages = [*MESSAGES, {"role": "assistant", "content": "Bonjour! In French, hello is"}]
    out = llm.chat(messages, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)[0]
    expected = hf_prompt(llm, messages, continue_final_message=True)
    assert out.prompt_token_ids == expected
    assert out.prompt.endswith("hello is")  # the turn is left open, not closed with <|im_end|>
    with pytest.raises(ValueError, match="Cannot set both `continue_final_message` and `add_generation_prompt`"):
        llm.chat(messages, GREEDY, use_tqdm=False, continue_final_message=True)


def test_chat_template_argument(llm):
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}" \
               "{% if add_generation_prompt %}[assistant] {% endif %}"
    out = llm.chat(MESSAGES, GREEDY, use_tqdm=False, chat_template=template)[0]
    assert out.prompt == "[system] Be brief.\n[user] Say hello in French.\n[assistant] "
    assert out.prompt_token_ids == llm.get_tokenizer().encode(out.prompt, add_special_tokens=False)
    with pytest.raises(ValueError, match="chat template could not render"):
        llm.chat(MESSAGES, GREEDY, use_tqdm=False, chat_template="{% if %}")


def test_several_conversations(llm):
    assert llm.chat([], GREEDY, use_tqdm=False) == []  # no conversations, no outputs
    out = llm.chat([MESSAGES, MESSAGES[1:]], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in out] == [hf_prompt(llm, MESSAGES, add_generation_prompt=True),
                                                 hf_prompt(llm, MESSAGES[1:], add_generation_prompt=True)]
