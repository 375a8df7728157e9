"""OpenAIServing: what the chat and completion endpoints share.

Checking the model name, turning token counts into the request's ``max_tokens`` (or a 400 when the
prompt leaves no room), turning ``ValueError``s into OpenAI's error shape, and formatting logprobs.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi.responses import JSONResponse

from tracevllm.engine.async_llm import AsyncLLM
from tracevllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, SamplingFields
from tracevllm.entrypoints.openai.serving_models import OpenAIServingModels

logger = logging.getLogger("tracevllm")

MAX_LOGPROBS = 20  # as vLLM's default max_logprobs


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


class OpenAIServing:
    def __init__(self, engine_client: AsyncLLM, models: OpenAIServingModels) -> None:
        self.engine_client = engine_client
        self.models = models
        self.tokenizer = engine_client.tokenizer
        self.max_model_len = engine_client.model_config.max_model_len

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

    def max_tokens_for(self, num_prompt_tokens: int, requested: int | None, field: str) -> int:
        """``requested`` checked against the context window; None means all the room that is left."""
        room = self.max_model_len - num_prompt_tokens
        if room <= 0:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request "
                f"has {num_prompt_tokens} input tokens. Please reduce the length of the input.",
                param="messages" if field == "max_completion_tokens" else "prompt",
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
