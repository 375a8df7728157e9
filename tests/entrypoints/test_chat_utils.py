"""chat_utils is the one reading of chat messages: the server's /v1/chat/completions and LLM.chat
get the same conversation and the same prompt ids from the same messages."""

from __future__ import annotations

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
    chat = OpenAIServingChat.__new__(OpenAIServingChat)  # only its tokenizer is needed here
    chat.tokenizer = tokenizer
    return chat


def test_server_and_llm_chat_read_messages_alike(tokenizer):
    request = ChatCompletionRequest(model="m", messages=MESSAGES, add_generation_prompt=False,
                                    continue_final_message=True)
    conversation = OpenAIServingChat.conversation(request)
    assert conversation == parse_chat_messages(MESSAGES)
    assert conversation[1] == {"role": "user", "content": "Say hello\nin French."}
    text = apply_chat_template(tokenizer, conversation, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("Bonjour")
    assert serving(tokenizer).render_chat(request, conversation) == tokenizer.encode(text, add_special_tokens=False)


def test_server_errors_are_400s_on_messages(tokenizer):
    bad = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(RequestError, match="Only text content parts") as e:
        OpenAIServingChat.conversation(bad)
    assert e.value.param == "messages"
    both = ChatCompletionRequest(model="m", messages=MESSAGES, continue_final_message=True)
    with pytest.raises(RequestError, match="Cannot set both") as e:
        serving(tokenizer).render_chat(both, OpenAIServingChat.conversation(both))
    assert e.value.param == "messages"
    with pytest.raises(RequestError, match="non-empty"):
        OpenAIServingChat.conversation(ChatCompletionRequest(model="m", messages=[]))
