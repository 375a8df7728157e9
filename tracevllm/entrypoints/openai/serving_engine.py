"""OpenAIServing: what the chat and completion endpoints share.

Checking the model name and the server's limits, running the tokenizer off the event loop (in a
lane by input size), turning token counts into the request's ``max_tokens`` (or a 400 when the
prompt leaves no room), turning exceptions into OpenAI's error shape (a client's mistake is told
as it is; a server's failure as one sentence, its traceback kept for the log), and formatting
logprobs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TypeVar

from fastapi.responses import JSONResponse

from tracevllm.engine.async_llm import AsyncLLM
from tracevllm.engine.exceptions import EngineDeadError, EngineGenerateError, EngineShutdownError
from tracevllm.engine.processor import MAX_LOGPROBS
from tracevllm.entrypoints.openai.protocol import (
    ErrorInfo, ErrorResponse, PromptLogprob, PromptLogprobs, SamplingFields,
)
from tracevllm.entrypoints.openai.request_limits import RequestError, RequestLimits
from tracevllm.entrypoints.openai.serving_models import OpenAIServingModels
from tracevllm.entrypoints.openai.tokenizer_lanes import TokenizerLanes
from tracevllm.outputs import PromptLogprobs as EnginePromptLogprobs

logger = logging.getLogger("tracevllm")


T = TypeVar("T")


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


def server_error_info(e: BaseException) -> ErrorInfo:
    """What a client is told of a failure on the server's side: one fixed sentence. The exception's
    text stays in the log (an EngineDeadError carries the engine core's whole traceback, which the
    output handler has logged once already; anything else is logged here)."""
    if isinstance(e, EngineDeadError):
        message = "The engine core died unexpectedly; see the server log for the cause."
    elif isinstance(e, EngineShutdownError):
        return ErrorInfo(message=str(e), type="server_error", code=int(HTTPStatus.SERVICE_UNAVAILABLE))
    else:
        logger.error("A request failed on the server's side", exc_info=e)
        failed = "The engine failed this request" if isinstance(e, EngineGenerateError) else "Internal server error"
        message = f"{failed}; see the server log for the cause."
    return ErrorInfo(message=message, type="server_error", code=500)


def server_error_response(e: BaseException) -> JSONResponse:
    """A 500; a 503 for a request the server stopped as it shuts down."""
    status = HTTPStatus.SERVICE_UNAVAILABLE if isinstance(e, EngineShutdownError) else HTTPStatus.INTERNAL_SERVER_ERROR
    return JSONResponse(ErrorResponse(error=server_error_info(e)).model_dump(), status_code=status)


def _field_names(names: Iterable[str], shown: int = 10, max_len: int = 40) -> str:
    """At most ``shown`` names of at most ``max_len`` characters: a log line's size must not be the client's choice."""
    names = sorted(names)
    listed = ", ".join(name if len(name) <= max_len else name[:max_len] + "..." for name in names[:shown])
    return listed + (f" ... and {len(names) - shown} more" if len(names) > shown else "")


class OpenAIServing:
    """``tokenizer_lanes``: shared by all the serving classes of one server (default: their own)."""

    def __init__(self, engine_client: AsyncLLM, models: OpenAIServingModels,
                 tokenizer_lanes: TokenizerLanes | None = None, limits: RequestLimits = RequestLimits()) -> None:
        self.engine_client = engine_client
        self.models = models
        self.tokenizer = engine_client.tokenizer
        self.max_model_len = engine_client.model_config.max_model_len
        self.tokenizer_lanes = tokenizer_lanes or TokenizerLanes()
        self.limits = limits

    async def run_tokenizer(self, size: int, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)``, a call that encodes, decodes or renders a chat template, in a
        tokenizer thread of the lane for an input of ``size`` characters or token ids (its
        exceptions, such as a RequestError, come back to the caller)."""
        return await asyncio.wrap_future(self.tokenizer_lanes.submit(size, functools.partial(fn, *args, **kwargs)))

    def check_prompt_bytes(self, text: str, param: str) -> None:
        """Refuse a prompt too long to fit the context window by its size alone, before the tokenizer
        spends seconds on it (the Processor says how many bytes can fit)."""
        try:
            self.engine_client.processor.check_prompt_bytes(text)
        except ValueError as e:
            raise RequestError(str(e), param=param) from e

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

    def check_model(self, model: str | None) -> None:
        """404 for a model this server does not serve, as OpenAI and vLLM answer."""
        if model is not None and not self.models.is_base_model(model):
            raise RequestError(f"The model `{model}` does not exist.", param="model", status=HTTPStatus.NOT_FOUND,
                               code="model_not_found")

    def check_request(self, request: SamplingFields, num_prompts: int = 1) -> str:
        """The served model name to answer with; RequestError for an unknown model, an unsupported
        field or a request over the server's limits."""
        self.check_model(request.model)
        self.limits.check(request, num_prompts)
        unsupported = request.unsupported_field()
        if unsupported is not None:
            raise RequestError(f"`{unsupported}` is not supported by tracevllm.", param=unsupported)
        if request.stream_options is not None and not request.stream:
            raise RequestError("stream_options may only be set when stream is true.", param="stream_options")
        if request.model_extra:
            logger.warning("Ignored fields in the request: %s", _field_names(request.model_extra))
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
        info = server_error_info(e)
    return f"data: {ErrorResponse(error=info).model_dump_json()}\n\n"
