"""OpenAIServing: what the chat and completion endpoints share.

Checking the model name, running the tokenizer off the event loop, turning token counts into the
request's ``max_tokens`` (or a 400 when the prompt leaves no room), turning ``ValueError``s into
OpenAI's error shape, and formatting logprobs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from http import HTTPStatus
from typing import TypeVar

from fastapi.responses import JSONResponse

from tracevllm.engine.async_llm import AsyncLLM
from tracevllm.engine.processor import MAX_LOGPROBS
from tracevllm.entrypoints.openai.protocol import (
    ErrorInfo, ErrorResponse, PromptLogprob, PromptLogprobs, SamplingFields,
)
from tracevllm.entrypoints.openai.serving_models import OpenAIServingModels
from tracevllm.outputs import PromptLogprobs as EnginePromptLogprobs

logger = logging.getLogger("tracevllm")


TOKENIZER_THREADS = 4
T = TypeVar("T")


class RequestError(ValueError):
    """A bad request: becomes HTTP ``status`` with OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def create_error_response(message: str, err_type: str = "invalid_request_error", param: str | None = None,
                          status: HTTPStatus = HTTPStatus.BAD_REQUEST, code: int | str | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=err_type, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


def error_from_exception(e: Exception) -> JSONResponse:
    """A RequestError or a ValueError (from SamplingParams or the Processor, which name the field first)."""
    if isinstance(e, RequestError):
        return create_error_response(str(e), param=e.param, status=e.status, code=e.code)
    message = str(e)
    first_word = message.split(" ", 1)[0]
    param = first_word if first_word in SamplingFields.model_fields else None
    return create_error_response(message, param=param)


def make_tokenizer_executor() -> ThreadPoolExecutor:
    """The threads that run the server's tokenizer calls (encode, decode, chat template).

    The event loop streams every client's tokens and answers ``/health``, and a 10 MB prompt keeps
    the tokenizer busy for about 5 s. Threads are enough because the Hugging Face fast tokenizer lets
    go of the GIL while its Rust code encodes (its ``encode`` goes through ``Tokenizer.encode_batch``:
    on 10 MB, a thread that sleeps 5 ms at a time waited 0.05 s at most, against 4.6 s while a direct
    ``Tokenizer.encode``, which keeps the GIL, ran). vLLM uses one thread; with one, a new request
    waits while a huge prompt ahead of it is tokenized (1.8 s, measured), hence a few. Several threads
    may call the tokenizer at once because nothing ever reconfigures it (truncation, padding): they
    only read it. A thread still takes a core: on a 2-core machine the engine core's forward pass
    (two OpenMP threads) ran about 10x slower while a huge prompt was encoded, though the loop kept up.
    """
    return ThreadPoolExecutor(max_workers=TOKENIZER_THREADS, thread_name_prefix="tokenizer")


class OpenAIServing:
    """``tokenizer_executor``: shared by all the serving classes of one server (default: its own)."""

    def __init__(self, engine_client: AsyncLLM, models: OpenAIServingModels,
                 tokenizer_executor: Executor | None = None) -> None:
        self.engine_client = engine_client
        self.models = models
        self.tokenizer = engine_client.tokenizer
        self.max_model_len = engine_client.model_config.max_model_len
        self.tokenizer_executor = tokenizer_executor or make_tokenizer_executor()

    async def run_tokenizer(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)``, a call that encodes, decodes or renders a chat template, in a
        tokenizer thread (its exceptions, such as a RequestError, come back to the caller)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.tokenizer_executor, functools.partial(fn, *args, **kwargs))

    @staticmethod
    def check_prompt_logprobs(request: SamplingFields) -> None:
        """As vLLM: in [0, MAX_LOGPROBS], and not with ``stream`` (they come whole, with the first token)."""
        if request.prompt_logprobs is None:
            return
        if request.stream:
            raise RequestError("prompt_logprobs are not available when stream is true.", param="prompt_logprobs")
        if not 0 <= request.prompt_logprobs <= MAX_LOGPROBS:
            raise RequestError(f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {request.prompt_logprobs}.",
                               param="prompt_logprobs")

    @staticmethod
    def prompt_logprobs_json(prompt_logprobs: EnginePromptLogprobs | None) -> PromptLogprobs | None:
        """The engine's prompt logprobs as vLLM's API writes them (-inf as -9999, as JSON cannot hold it)."""
        if prompt_logprobs is None:
            return None
        return [None if position is None else {
            token_id: PromptLogprob(logprob=max(lp.logprob, -9999.0), rank=lp.rank, decoded_token=lp.decoded_token)
            for token_id, lp in position.items()
        } for position in prompt_logprobs]

    def check_request(self, request: SamplingFields) -> str:
        """The served model name to answer with; RequestError for an unknown model or unsupported field."""
        if request.model is not None and not self.models.is_base_model(request.model):
            raise RequestError(f"The model `{request.model}` does not exist.", param="model", code="model_not_found")
        unsupported = request.unsupported_field()
        if unsupported is not None:
            raise RequestError(f"`{unsupported}` is not supported by tracevllm.", param=unsupported)
        if request.stream_options is not None and not request.stream:
            raise RequestError("stream_options may only be set when stream is true.", param="stream_options")
        if request.model_extra:
            logger.warning("Ignored fields in the request: %s", sorted(request.model_extra))
        return request.model or self.models.base_model_name

    def max_tokens_for(self, num_prompt_tokens: int, requested: int | None, field: str,
                       prompt_param: str = "prompt") -> int:
        """``requested`` checked against the context window; None means all the room that is left.
        ``field`` and ``prompt_param`` name the request's fields for an error (a chat's prompt is its
        ``messages``)."""
        room = self.max_model_len - num_prompt_tokens
        if room <= 0:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request "
                f"has {num_prompt_tokens} input tokens. Please reduce the length of the input.",
                param=prompt_param,
            )
        if requested is None:
            return room
        if requested < 1:
            raise RequestError(f"{field} must be at least 1, got {requested}.", param=field)
        if requested > room:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{requested + num_prompt_tokens} tokens ({num_prompt_tokens} in the input, {requested} in the "
                f"completion). Please reduce the length of the input or of the completion.",
                param=field,
            )
        return requested


def stream_error(e: Exception) -> str:
    """An error in the middle of an SSE stream, as OpenAI sends it (the status line is already 200)."""
    if isinstance(e, ValueError):
        info = ErrorInfo(message=str(e), type="invalid_request_error", param=getattr(e, "param", None), code=400)
    else:
        logger.error("Request failed mid-stream: %s", e)
        info = ErrorInfo(message=str(e) or repr(e), type="server_error", code=500)
    return f"data: {ErrorResponse(error=info).model_dump_json()}\n\n"
