"""Turn what the user passed as prompts into ``ParsedPrompt``s: the one place that reads prompt forms.

``parse_prompts`` tells one prompt from a list of them (``LLM.generate`` takes both);
``parse_singleton_prompt`` checks one prompt's form (the Processor calls it before tokenizing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracevllm.inputs.data import PromptType

_TEXT_KEYS = {"prompt"}
_TOKENS_KEYS = {"prompt_token_ids", "prompt"}


@dataclass(frozen=True, slots=True)
class ParsedPrompt:
    """Exactly one of ``text`` (to tokenize) and ``token_ids`` (to use as they are) is the input;
    with token ids, ``text`` is only the user's note of what they say (it may be None)."""

    text: str | None
    token_ids: list[int] | None


def _is_token_ids(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def lone_surrogate_at(text: str) -> int | None:
    """Where ``text`` has a lone surrogate (``"\\ud800"``, which JSON's escapes and Python's strings
    allow), None if it has none. UTF-8 cannot encode one, so the tokenizer cannot take it, nor msgpack
    send it to the engine core: every text from a user is checked with this before either."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _text_to_tokenize(text: str) -> str:
    if (position := lone_surrogate_at(text)) is not None:
        raise ValueError(f"The prompt is not valid Unicode: a lone surrogate at position {position}.")
    return text


def parse_singleton_prompt(prompt: PromptType) -> ParsedPrompt:
    """One prompt: a str, a TextPrompt / TokensPrompt dict, or a list of token ids. ValueError otherwise."""
    if isinstance(prompt, str):
        return ParsedPrompt(_text_to_tokenize(prompt), None)
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            extra = set(prompt) - _TOKENS_KEYS
            if extra:
                raise ValueError(f"A TokensPrompt has only 'prompt_token_ids' (and 'prompt'); "
                                 f"got unsupported keys {sorted(extra)}.")
            token_ids, text = prompt["prompt_token_ids"], prompt.get("prompt")
            if not _is_token_ids(token_ids):
                raise ValueError("TokensPrompt's 'prompt_token_ids' must be a list of token ids (ints).")
            if text is not None and not isinstance(text, str):
                raise ValueError(f"TokensPrompt's 'prompt' must be a string, got {type(text).__name__}.")
            return ParsedPrompt(text, list(token_ids))
        if "prompt" in prompt:
            extra = set(prompt) - _TEXT_KEYS
            if extra:
                raise ValueError(f"A TextPrompt has only 'prompt'; got unsupported keys {sorted(extra)}.")
            if not isinstance(prompt["prompt"], str):
                raise ValueError(f"TextPrompt's 'prompt' must be a string, got {type(prompt['prompt']).__name__}.")
            return ParsedPrompt(_text_to_tokenize(prompt["prompt"]), None)
        raise ValueError(
            f"A prompt dict must be a TextPrompt ({{'prompt': str}}) or a TokensPrompt "
            f"({{'prompt_token_ids': list[int]}}); got keys {sorted(map(str, prompt))}."
        )
    if _is_token_ids(prompt):
        return ParsedPrompt(None, list(prompt))  # type: ignore[arg-type]
    raise ValueError(
        "A prompt must be a string, a TextPrompt ({'prompt': str}), a TokensPrompt "
        f"({{'prompt_token_ids': list[int]}}) or a list of token ids; got {type(prompt).__name__}."
    )


def parse_prompts(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    """One prompt or a sequence of them, as a list of single prompts (each checked later).

    A str, a dict or a list of ints is one prompt; any other sequence is a list of prompts (so a
    list of lists of ints is several token-id prompts)."""
    if isinstance(prompts, (str, dict)):
        return [prompts]  # type: ignore[list-item]
    if not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a prompt or a list of prompts, got {type(prompts).__name__}.")
    if prompts and _is_token_ids(prompts):
        return [list(prompts)]  # type: ignore[arg-type]
    return list(prompts)  # type: ignore[arg-type]
