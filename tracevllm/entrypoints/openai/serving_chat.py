"""OpenAIServingChat: ``POST /v1/chat/completions``.

messages -> chat template -> token ids -> ``AsyncLLM.generate`` -> one ``ChatCompletionResponse``, or
(``stream: true``) SSE chunks: a first chunk with the assistant role per choice, then content
deltas, a last chunk with the finish reason, an optional usage chunk, then ``data: [DONE]``.
The chat template and the tokenizer run in a tokenizer thread, never on the event loop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator

from tracevllm.entrypoints.chat_utils import apply_chat_template, parse_chat_messages
from tracevllm.entrypoints.openai.protocol import (
    ChatCompletionLogProb, ChatCompletionLogProbs, ChatCompletionLogProbsContent, ChatCompletionRequest,
    ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse, ChatMessage, DeltaMessage, TokenizeChatRequest, UsageInfo,
)
from tracevllm.entrypoints.openai.serving_engine import MAX_LOGPROBS, OpenAIServing, RequestError, stream_error
from tracevllm.outputs import RequestOutput, SampleLogprobs


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(
        self, request: ChatCompletionRequest, trace_headers: dict[str, str] | None = None
    ) -> ChatCompletionResponse | AsyncGenerator[str, None]:
        """The response, or an SSE generator when streaming. Raises ValueError for a bad request.
        ``trace_headers``: the HTTP request's span, parent of this request's spans."""
        arrival_time = time.time()
        model_name = self.check_request(request)
        if request.top_logprobs is not None:
            if not request.logprobs:
                raise RequestError("top_logprobs may only be set when logprobs is true.", param="top_logprobs")
            if not 0 <= request.top_logprobs <= MAX_LOGPROBS:
                raise RequestError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {request.top_logprobs}.",
                                   param="top_logprobs")
        self.check_prompt_logprobs(request)
        conversation, size = self.conversation(request)
        prompt_ids = await self.run_tokenizer(size, self.render_chat, request, conversation)
        field = "max_tokens" if request.max_completion_tokens is None and request.max_tokens is not None \
            else "max_completion_tokens"
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        max_tokens = self.max_tokens_for(len(prompt_ids), requested, field, prompt_param="messages")
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = request.to_sampling_params(max_tokens, logprobs, request.prompt_logprobs)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        generator = self.engine_client.generate(
            prompt_ids, params, request_id, request.priority, trace_headers=trace_headers,
            arrival_time=arrival_time, messages=conversation,
        )
        if request.stream:
            return self.chat_completion_stream_generator(request, generator, request_id, model_name, len(prompt_ids))
        return await self.chat_completion_full_generator(request, generator, request_id, model_name, len(prompt_ids))

    def conversation(self, request: ChatCompletionRequest | TokenizeChatRequest) -> tuple[list[dict], int]:
        """The messages as the chat template takes them, text parts joined (as ``LLM.chat`` does), and
        the length of their text; a RequestError when that text alone is too long for the context
        window (checked before the template and the tokenizer spend time on it)."""
        try:
            conversation = parse_chat_messages([m.model_dump(exclude_none=True) for m in request.messages])
        except ValueError as e:
            raise RequestError(str(e), param="messages") from e
        text = "".join(message["content"] for message in conversation)
        self.check_prompt_bytes(text, "messages")
        return conversation, len(text)

    def render_chat(self, request: ChatCompletionRequest | TokenizeChatRequest, conversation: list[dict]) -> list[int]:
        """The conversation through the model's chat template, as token ids. The template writes the
        special tokens, so by default (``add_special_tokens=False``, as in vLLM) the tokenizer adds
        none: the same ids as ``LLM.chat``; ``True`` adds them on top (a second BOS, say)."""
        try:
            text = apply_chat_template(
                self.tokenizer, conversation, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                chat_template_kwargs=request.chat_template_kwargs,
            )
        except ValueError as e:
            raise RequestError(str(e), param="messages") from e
        return self.tokenizer.encode(text, add_special_tokens=request.add_special_tokens)

    async def chat_completion_full_generator(
        self, request: ChatCompletionRequest, generator: AsyncGenerator[RequestOutput, None], request_id: str,
        model_name: str, num_prompt_tokens: int,
    ) -> ChatCompletionResponse:
        final = None
        async for final in generator:
            pass
        assert final is not None
        top = request.top_logprobs or 0
        choices = [
            ChatCompletionResponseChoice(
                index=o.index,
                message=ChatMessage(role="assistant", content=o.text),
                logprobs=self._chat_logprobs(o.token_ids, o.logprobs, top) if request.logprobs else None,
                finish_reason=o.finish_reason,
                stop_reason=o.stop_reason,
            )
            for o in final.outputs
        ]
        num_generated = sum(len(o.token_ids) for o in final.outputs)
        usage = UsageInfo(prompt_tokens=num_prompt_tokens, completion_tokens=num_generated,
                          total_tokens=num_prompt_tokens + num_generated)
        return ChatCompletionResponse(id=request_id, model=model_name, choices=choices, usage=usage,
                                      prompt_logprobs=self.prompt_logprobs_json(final.prompt_logprobs))

    async def chat_completion_stream_generator(
        self, request: ChatCompletionRequest, generator: AsyncGenerator[RequestOutput, None], request_id: str,
        model_name: str, num_prompt_tokens: int,
    ) -> AsyncGenerator[str, None]:
        def chunk(choices: list[ChatCompletionResponseStreamChoice], usage: UsageInfo | None = None) -> str:
            response = ChatCompletionStreamResponse(id=request_id, model=model_name, choices=choices, usage=usage)
            return f"data: {response.model_dump_json()}\n\n"

        num_generated = [0] * request.n
        finished = [False] * request.n
        top = request.top_logprobs or 0
        try:
            first = True
            async for result in generator:
                if first:
                    for i in range(request.n):
                        yield chunk([ChatCompletionResponseStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))])
                    first = False
                for o in result.outputs:
                    if finished[o.index] or not (o.token_ids or o.text or o.finish_reason):
                        continue
                    num_generated[o.index] += len(o.token_ids)
                    finished[o.index] = o.finish_reason is not None
                    yield chunk([ChatCompletionResponseStreamChoice(
                        index=o.index,
                        delta=DeltaMessage(content=o.text),
                        logprobs=self._chat_logprobs(o.token_ids, o.logprobs, top) if request.logprobs else None,
                        finish_reason=o.finish_reason,
                        stop_reason=o.stop_reason,
                    )])
            if request.stream_options is not None and request.stream_options.include_usage:
                total = sum(num_generated)
                yield chunk([], UsageInfo(prompt_tokens=num_prompt_tokens, completion_tokens=total,
                                          total_tokens=num_prompt_tokens + total))
        except Exception as e:
            yield stream_error(e)
        finally:
            await generator.aclose()  # a client that left: aborts the request in the engine core
        yield "data: [DONE]\n\n"

    def _chat_logprobs(self, token_ids: list[int], logprobs: SampleLogprobs | None, top: int) -> ChatCompletionLogProbs:
        content = []
        for token_id, position in zip(token_ids, logprobs or []):
            sampled = position[token_id]
            token = sampled.decoded_token
            ranked = sorted(position.items(), key=lambda item: item[1].rank)[:top]
            content.append(ChatCompletionLogProbsContent(
                token=token, logprob=max(sampled.logprob, -9999.0), bytes=list(token.encode()),
                top_logprobs=[
                    ChatCompletionLogProb(token=(t := lp.decoded_token),
                                          logprob=max(lp.logprob, -9999.0), bytes=list(t.encode()))
                    for tid, lp in ranked
                ],
            ))
        return ChatCompletionLogProbs(content=content)
