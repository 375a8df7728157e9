"""OpenAIServingCompletion: ``POST /v1/completions`` (the legacy text-completion API).

A request may carry several prompts (strings or token-id lists); each becomes one
``AsyncLLM.generate`` stream, merged as they come. Choice ``i * n + j`` is sample ``j`` of prompt ``i``.
Prompts are tokenized (and echoes decoded) in a tokenizer thread, never on the event loop; the
engine gets token ids.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator

from tracevllm.entrypoints.openai.protocol import (
    CompletionLogProbs, CompletionRequest, CompletionResponse, CompletionResponseChoice,
    UsageInfo,
)
from tracevllm.entrypoints.openai.serving_engine import MAX_LOGPROBS, OpenAIServing, RequestError, stream_error
from tracevllm.entrypoints.utils import merge_async_iterators
from tracevllm.outputs import CompletionOutput, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(
        self, request: CompletionRequest, trace_headers: dict[str, str] | None = None
    ) -> CompletionResponse | AsyncGenerator[str, None]:
        """The response, or an SSE generator when streaming. Raises ValueError for a bad request.
        ``trace_headers``: the HTTP request's span, parent of this request's spans."""
        arrival_time = time.time()
        inputs = self.split_prompts(request.prompt)
        model_name = self.check_request(request, num_prompts=len(inputs))
        for prompt in inputs:
            if isinstance(prompt, str):
                self.check_prompt_bytes(prompt, "prompt")
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_LOGPROBS:
            raise RequestError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {request.logprobs}.", param="logprobs")
        self.check_prompt_logprobs(request)
        # Echoing the prompt with logprobs needs the prompt's logprobs too (vLLM asks for as many).
        prompt_logprobs = request.prompt_logprobs
        if prompt_logprobs is None and request.echo and request.logprobs is not None:
            prompt_logprobs = request.logprobs
        prompts = await self.run_tokenizer(sum(map(len, inputs)), self.tokenize_prompts, inputs)
        generators = []
        request_id = f"cmpl-{uuid.uuid4().hex}"
        for i, prompt_ids in enumerate(prompts):
            max_tokens = self.max_tokens_for(len(prompt_ids), request.max_tokens, "max_tokens")
            params = request.to_sampling_params(max_tokens, request.logprobs, prompt_logprobs)
            generators.append(self.engine_client.generate(
                prompt_ids, params, f"{request_id}-{i}", request.priority, trace_headers=trace_headers,
                arrival_time=arrival_time,
            ))
        echoes = [""] * len(prompts)
        if request.echo:
            echoes = await self.run_tokenizer(sum(map(len, prompts)),
                                              lambda: [self.tokenizer.decode(ids) for ids in prompts])
        merged = merge_async_iterators(*generators)
        if request.stream:
            return self.completion_stream_generator(request, merged, request_id, model_name, prompts, echoes)
        finals: list[RequestOutput | None] = [None] * len(prompts)
        async for i, result in merged:
            finals[i] = result
        choices, num_generated = [], 0
        for i, final in enumerate(finals):
            assert final is not None
            for o in final.outputs:
                num_generated += len(o.token_ids)
                choices.append(CompletionResponseChoice(
                    index=i * request.n + o.index, text=echoes[i] + o.text,
                    logprobs=self._echo_and_logprobs(request, final, o) if request.logprobs is not None else None,
                    finish_reason=o.finish_reason, stop_reason=o.stop_reason,
                    prompt_logprobs=self.prompt_logprobs_json(final.prompt_logprobs),
                ))
        num_prompt = sum(len(p) for p in prompts)
        usage = UsageInfo(prompt_tokens=num_prompt, completion_tokens=num_generated, total_tokens=num_prompt + num_generated)
        return CompletionResponse(id=request_id, model=model_name, choices=choices, usage=usage)

    @staticmethod
    def split_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
        """The request's prompts, each a string or a list of token ids."""
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise RequestError("prompt must not be empty.", param="prompt")
        return [prompt] if isinstance(prompt[0], int) else prompt  # type: ignore[list-item]

    def tokenize_prompts(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """Each prompt's token ids, checked (RequestError); run in a tokenizer thread, checks included
        (on millions of ids they take a while too)."""
        vocab_size = self.engine_client.model_config.vocab_size
        token_ids = []
        for p in prompts:
            ids = self.tokenizer.encode(p) if isinstance(p, str) else list(p)
            if not ids:
                raise RequestError("A prompt must have at least one token.", param="prompt")
            if min(ids) < 0 or max(ids) >= vocab_size:
                raise RequestError(f"Prompt token ids must be in [0, {vocab_size}).", param="prompt")
            token_ids.append(ids)
        return token_ids

    async def completion_stream_generator(
        self, request: CompletionRequest, merged: AsyncGenerator[tuple[int, RequestOutput], None], request_id: str,
        model_name: str, prompts: list[list[int]], echoes: list[str],
    ) -> AsyncGenerator[str, None]:
        n = request.n
        num_choices = len(prompts) * n
        num_generated = [0] * num_choices
        finished = [False] * num_choices
        text_offset = [len(echoes[c // n]) for c in range(num_choices)]
        echoed = [not request.echo] * num_choices
        prompt_logprobs: list = [None] * len(prompts)  # they come once per prompt, with its first output
        try:
            async for i, result in merged:
                prompt_logprobs[i] = result.prompt_logprobs = result.prompt_logprobs or prompt_logprobs[i]
                for o in result.outputs:
                    c = i * n + o.index
                    if finished[c] or not (o.token_ids or o.text or o.finish_reason):
                        continue
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = self._logprobs(o.token_ids, o.logprobs, request.logprobs, text_offset[c]) \
                            if echoed[c] else self._echo_and_logprobs(request, result, o)
                    text = o.text if echoed[c] else echoes[i] + o.text
                    echoed[c] = True
                    text_offset[c] += len(o.text)
                    num_generated[c] += len(o.token_ids)
                    finished[c] = o.finish_reason is not None
                    response = CompletionResponse(id=request_id, model=model_name, choices=[
                        CompletionResponseChoice(index=c, text=text, logprobs=logprobs,
                                                 finish_reason=o.finish_reason, stop_reason=o.stop_reason)
                    ])
                    yield f"data: {response.model_dump_json()}\n\n"
            if request.stream_options is not None and request.stream_options.include_usage:
                num_prompt, total = sum(len(p) for p in prompts), sum(num_generated)
                usage = UsageInfo(prompt_tokens=num_prompt, completion_tokens=total, total_tokens=num_prompt + total)
                response = CompletionResponse(id=request_id, model=model_name, choices=[], usage=usage)
                yield f"data: {response.model_dump_json()}\n\n"
        except Exception as e:
            yield stream_error(e)
        finally:
            await merged.aclose()
        yield "data: [DONE]\n\n"

    def _echo_and_logprobs(self, request: CompletionRequest, result: RequestOutput,
                           output: CompletionOutput) -> CompletionLogProbs:
        """The output's logprobs, after the prompt's when the prompt is echoed (as vLLM: the first
        prompt token has none, so its logprob and top entries are null)."""
        if not request.echo:
            return self._logprobs(output.token_ids, output.logprobs, request.logprobs, 0)
        prompt = self._logprobs(result.prompt_token_ids, result.prompt_logprobs, request.logprobs, 0)
        generated = self._logprobs(output.token_ids, output.logprobs, request.logprobs, sum(map(len, prompt.tokens)))
        for field in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
            getattr(prompt, field).extend(getattr(generated, field))
        return prompt

    def _logprobs(self, token_ids: list[int], positions: list | None, num_top: int,
                  text_offset: int) -> CompletionLogProbs:
        """The legacy format: per token its text, logprob, offset, and the top ``num_top`` (plus the
        token itself when it is not among them); a position without logprobs (a prompt's first
        token) has null ones."""
        result = CompletionLogProbs()
        for token_id, position in zip(token_ids, positions or []):
            if position is None:
                token = self.tokenizer.decode([token_id])
                result.tokens.append(token)
                result.token_logprobs.append(None)
                result.text_offset.append(text_offset)
                result.top_logprobs.append(None)
                text_offset += len(token)
                continue
            chosen = position[token_id]
            token = chosen.decoded_token
            result.tokens.append(token)
            result.token_logprobs.append(max(chosen.logprob, -9999.0))
            result.text_offset.append(text_offset)
            text_offset += len(token)
            ranked = sorted(position.items(), key=lambda item: item[1].rank)
            top = {lp.decoded_token: max(lp.logprob, -9999.0)
                   for tid, lp in ranked if lp.rank <= num_top or tid == token_id}
            result.top_logprobs.append(top)
        return result
