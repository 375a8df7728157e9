"""chat_utils is the one reading of chat messages: the server's /v1/chat/completions and LLM.chat
get the same conversation and the same prompt ids from the same messages."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tracevllm.entrypoints.chat_utils import apply_chat_template, parse_chat_messages
from tracevllm.entrypoints.openai.protocol import ChatCompletionRequest
from tracevllm.entrypoints.openai.serving_chat import OpenAIServingChat
from tracevllm.entrypoints.openai.serving_engine import RequestError

MESSAGES = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Say hello"}, {"type": "text", "text": "in French."}]},
    {"role": "assistant", "content": "Bonjour"},
]


@pytest.fixture(scope="module")
def tokenizer(bundled_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model_dir, local_files_only=True)


def serving(tokenizer) -> OpenAIServingChat:
    """Only its tokenizer and the Processor's byte check are needed here (the check passes all)."""
    chat = OpenAIServingChat.__new__(OpenAIServingChat)
    chat.tokenizer = tokenizer
    chat.engine_client = SimpleNamespace(processor=SimpleNamespace(check_prompt_bytes=lambda text: None))
    return chat


def test_server_and_llm_chat_read_messages_alike(tokenizer):
    request = ChatCompletionRequest(model="m", messages=MESSAGES, add_generation_prompt=False,
                                    continue_final_message=True)
    conversation, text_len = serving(tokenizer).conversation(request)
    assert conversation == parse_chat_messages(MESSAGES)
    assert text_len == len("Be brief.Say hello\nin French.Bonjour")
    assert conversation[1] == {"role": "user", "content": "Say hello\nin French."}
    text = apply_chat_template(tokenizer, conversation, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("Bonjour")
    assert serving(tokenizer).render_chat(request, conversation) == tokenizer.encode(text, add_special_tokens=False)


def test_server_errors_are_400s_on_messages(tokenizer):
    bad = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(RequestError, match="Only text content parts") as e:
        serving(tokenizer).conversation(bad)
    assert e.value.param == "messages"
    both = ChatCompletionRequest(model="m", messages=MESSAGES, continue_final_message=True)
    with pytest.raises(RequestError, match="Cannot set both") as e:
        serving(tokenizer).render_chat(both, serving(tokenizer).conversation(both)[0])
    assert e.value.param == "messages"
    with pytest.raises(RequestError, match="non-empty"):
        serving(tokenizer).conversation(ChatCompletionRequest(model="m", messages=[]))
