"""The prompt forms of vLLM's offline API, as TypedDicts (plain dicts at run time).

``llm.generate("Hi")``, ``llm.generate({"prompt": "Hi"})`` and
``llm.generate({"prompt_token_ids": [1, 2, 3]})`` are the same three forms vLLM accepts; a bare list
of token ids (``llm.generate([1, 2, 3])``) is tracevllm's older spelling of the third and still
works. vLLM's multimodal keys (``multi_modal_data``, ...) have no meaning for these text-only models
and are refused, not ignored.
"""

from __future__ import annotations

from typing import TypeAlias

from typing_extensions import NotRequired, TypedDict  # typing has NotRequired from Python 3.11


class TextPrompt(TypedDict):
    """A prompt as text, tokenized by the engine (the tokenizer adds its special tokens, e.g. BOS)."""

    prompt: str


class TokensPrompt(TypedDict):
    """A prompt as token ids, passed to the model as they are."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]  # the text behind the ids, if known: reported back as RequestOutput.prompt


SingletonPrompt: TypeAlias = str | TextPrompt | TokensPrompt
"""One prompt."""

PromptType: TypeAlias = SingletonPrompt | list[int]
"""One prompt as ``LLM.generate``, ``LLMEngine.add_request`` and ``AsyncLLM.generate`` take it."""
