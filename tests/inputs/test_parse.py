"""Prompt forms: what parse_prompts and parse_singleton_prompt accept, and what is a ValueError."""

from __future__ import annotations

import pytest

from tracevllm.inputs import ParsedPrompt, TextPrompt, TokensPrompt, parse_prompts, parse_singleton_prompt


def test_singleton_forms():
    assert parse_singleton_prompt("hi") == ParsedPrompt("hi", None)
    assert parse_singleton_prompt(TextPrompt(prompt="hi")) == ParsedPrompt("hi", None)
    assert parse_singleton_prompt(TokensPrompt(prompt_token_ids=[1, 2])) == ParsedPrompt(None, [1, 2])
    assert parse_singleton_prompt({"prompt_token_ids": (1, 2), "prompt": "a b"}) == ParsedPrompt("a b", [1, 2])
    assert parse_singleton_prompt([3, 4]) == ParsedPrompt(None, [3, 4])


@pytest.mark.parametrize("prompt, match", [
    ({"text": "hi"}, "TextPrompt .* or a TokensPrompt"),
    ({}, "TextPrompt"),
    ({"prompt": 5}, "'prompt' must be a string"),
    ({"prompt_token_ids": "1 2"}, "list of token ids"),
    ({"prompt_token_ids": [1, "2"]}, "list of token ids"),
    ({"prompt": "hi", "multi_modal_data": {}}, "unsupported keys"),
    ({"prompt_token_ids": [1], "cache_salt": "x"}, "unsupported keys"),
    (3.5, "got float"),
    ([1, "a"], "got list"),
    ([True, 2], "got list"),
    ("\ud800", "not valid Unicode: a lone surrogate at position 0"),
    ({"prompt": "ab\udfff"}, "not valid Unicode: a lone surrogate at position 2"),
])
def test_bad_prompts(prompt, match):
    with pytest.raises(ValueError, match=match):
        parse_singleton_prompt(prompt)


def test_one_prompt_or_a_list():
    assert parse_prompts("hi") == ["hi"]
    assert parse_prompts({"prompt": "hi"}) == [{"prompt": "hi"}]  # a dict is one prompt, not its keys
    assert parse_prompts([1, 2, 3]) == [[1, 2, 3]]
    assert parse_prompts([[1, 2], [3]]) == [[1, 2], [3]]
    mixed = ["a", {"prompt": "b"}, {"prompt_token_ids": [1]}, [2, 3]]
    assert parse_prompts(mixed) == mixed
    assert parse_prompts([]) == []
    with pytest.raises(ValueError, match="prompts must be"):
        parse_prompts(42)  # type: ignore[arg-type]
