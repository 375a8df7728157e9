"""OpenAIServingTokenization: vLLM's ``POST /tokenize`` and ``POST /detokenize``.

A completion-style request (``prompt``) is encoded as ``/v1/completions`` would encode it; a chat-style
one (``messages``) goes through the chat template exactly as ``/v1/chat/completions`` renders it, so
``count`` is the prompt length that endpoint would see (``add_special_tokens`` defaults to True for a
prompt and to False for messages, whose template writes its own, as in vLLM). The tokenizer runs in
a tokenizer thread: a huge prompt must not stall the event loop that streams every other request's
tokens.
"""

from __future__ import annotations

from tracevllm.entrypoints.openai.protocol import (
    DetokenizeRequest, DetokenizeResponse, TokenizeChatRequest, TokenizeRequest, TokenizeResponse,
)
from tracevllm.entrypoints.openai.serving_chat import OpenAIServingChat
from tracevllm.entrypoints.openai.serving_engine import OpenAIServing, RequestError


class OpenAIServingTokenization(OpenAIServing):
    def __init__(self, engine_client, models, serving_chat: OpenAIServingChat) -> None:
        super().__init__(engine_client, models, serving_chat.tokenizer_lanes, serving_chat.limits)
        self.serving_chat = serving_chat

    async def create_tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        if isinstance(request, TokenizeChatRequest):
            conversation, size = self.serving_chat.conversation(request)
            tokens = await self.run_tokenizer(size, self.serving_chat.render_chat, request, conversation)
        else:
            self.check_prompt_bytes(request.prompt, "prompt")
            tokens = await self.run_tokenizer(len(request.prompt), self.tokenizer.encode, request.prompt,
                                              add_special_tokens=request.add_special_tokens)
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=tokens)

    async def create_detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        vocab_size = len(self.tokenizer)
        bad = next((t for t in request.tokens if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise RequestError(f"Token id {bad} is out of vocabulary (0 to {vocab_size - 1}).", param="tokens")
        prompt = await self.run_tokenizer(len(request.tokens), self.tokenizer.decode, request.tokens)
        return DetokenizeResponse(prompt=prompt)
