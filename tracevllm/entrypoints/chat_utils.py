"""Chat messages to a prompt: shared by ``LLM.chat`` and the server's ``/v1/chat/completions``.

``parse_chat_messages`` checks the messages and joins a content given as a list of parts
(``[{"type": "text", "text": ...}, ...]``, OpenAI's form) into one string, with "\\n" between parts
as vLLM's "string" content format does; ``apply_chat_template`` renders them to text with the
tokenizer's chat template (or the one given), under vLLM's rules for ``add_generation_prompt`` and
``continue_final_message``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("Only text content parts ({'type': 'text', 'text': str}) are supported.")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ValueError(f"A message's content must be a string or a list of text parts, got {type(content).__name__}.")


def parse_chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the chat template takes them: each a dict with its ``role`` and its
    ``content`` as one string (other keys, such as ``name``, are passed on as they are).
    ValueError for an empty conversation, a message without a role, or a non-text content part."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError("A conversation must be a non-empty list of {'role': ..., 'content': ...} dicts.")
    conversation = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError("Each message must be a dict with a 'role' (str) and a 'content'.")
        conversation.append({**message, "content": _content_text(message.get("content"))})
    return conversation


def apply_chat_template(
    tokenizer, conversation: list[dict[str, Any]], *, chat_template: str | None = None,
    add_generation_prompt: bool = True, continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The conversation rendered as prompt text (it holds its own special tokens, so it is to be
    tokenized with ``add_special_tokens=False``).

    ``add_generation_prompt``: end with the header of a new assistant turn; ``continue_final_message``:
    end inside the last message instead, so that the model goes on writing it. Both at once is a
    ValueError, as in vLLM. A template that fails on these messages is a ValueError too.
    """
    if add_generation_prompt and continue_final_message:
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("This model's tokenizer has no chat template: give one (chat_template) or send a plain "
                         "prompt (LLM.generate, /v1/completions).")
    try:
        return tokenizer.apply_chat_template(
            conversation, chat_template=chat_template, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **(chat_template_kwargs or {}),
        )
    except Exception as e:  # the template's own checks (e.g. role order) raise various errors
        raise ValueError(f"The chat template could not render these messages: {e}") from e
