"""Every error the server answers, from any layer, in OpenAI's shape.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

Four layers can refuse a request, and each gets a handler here:

    RequestBodyLimitMiddleware   a body over --max-request-body-bytes          413
                                 a body not in within --read-timeout           408
    FastAPI's body parsing       not JSON, not UTF-8, nested too deep, empty   400
    pydantic validation          a field of the wrong type or out of range     400, ``param`` names it
    Starlette routing            an unknown path, a wrong method               404, 405

and anything unexpected is a 500 in the same shape, which says only that it happened: its
traceback goes to the log; the server goes on serving. (Errors the serving classes raise as
ValueError are mapped in serving_engine.)
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tracevllm.entrypoints.openai.serving_engine import create_error_response, server_error_response

UNION_TAGS = {"completion", "chat"}  # the tags of protocol.TokenizeRequest, not field names


class RequestBodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than the server's limit of {limit} bytes "
                         f"(--max-request-body-bytes).")


class RequestBodyTimeout(Exception):
    def __init__(self, timeout: float) -> None:
        super().__init__(f"The request body did not arrive within {timeout:g} s (the server's --read-timeout).")


class RequestBodyLimitMiddleware:
    """A body the server will read: at most ``limit`` bytes, all in within ``timeout`` seconds.

    413 for a larger body: at once when Content-Length says so, else as soon as the streamed body
    passes it (so a huge body is never held in memory, nor parsed on the event loop). 408, and the
    connection closed, for a body not complete ``timeout`` seconds after the request's head came: a
    client that stops half-way (slowloris) would otherwise hold its connection and its handler for
    ever. (The head has its own deadline: header_timeout.py.)
    """

    def __init__(self, app, limit: int, timeout: float) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            response = _too_large(RequestBodyTooLarge(self.limit))
            return await response(scope, receive, send)
        received, complete = 0, False
        deadline = asyncio.get_running_loop().time() + self.timeout

        async def limited_receive():
            nonlocal received, complete
            if complete:
                return await receive()  # only a disconnect can come now, whenever it comes
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestBodyTimeout(self.timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise RequestBodyTooLarge(self.limit)
                complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)


def _too_large(e: RequestBodyTooLarge) -> JSONResponse:
    return create_error_response(str(e), status=HTTPStatus.REQUEST_ENTITY_TOO_LARGE)


async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if errors and errors[0]["type"] == "json_invalid":
        ctx = errors[0].get("ctx", {})
        position = errors[0]["loc"][-1]
        return create_error_response(
            f"The request body is not valid JSON: {ctx.get('error', 'decode error')} (at character {position})."
        )
    if errors and errors[0]["type"] == "missing" and tuple(errors[0]["loc"]) == ("body",):
        return create_error_response("The request body is empty; send a JSON object.")
    messages, params = [], []
    for error in errors:
        loc = [str(part) for part in error["loc"] if part != "body" and part not in UNION_TAGS]
        messages.append(f"{'.'.join(loc)}: {error['msg']}" if loc else error["msg"])
        params.append(loc[0] if loc else None)
    return create_error_response("; ".join(messages) or "Invalid request.", param=params[0] if params else None)


async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's 404/405, and FastAPI's 400 for a body it could not parse (the cause says why)."""
    cause = exc.__cause__
    if isinstance(cause, RequestBodyTooLarge):
        return _too_large(cause)
    if isinstance(cause, RequestBodyTimeout):
        response = create_error_response(str(cause), status=HTTPStatus.REQUEST_TIMEOUT)
        response.headers["Connection"] = "close"  # the rest of the body may still come: not a next request
        return response
    if isinstance(cause, UnicodeDecodeError):
        message = f"The request body is not valid UTF-8: byte {cause.object[cause.start]:#x} at position {cause.start}."
    elif isinstance(cause, RecursionError):
        message = "The request body's JSON is nested too deeply."
    elif exc.status_code == HTTPStatus.NOT_FOUND:
        message = "Not found: no such route."
    elif exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
        message = "Method not allowed on this route."
    else:
        message = str(exc.detail)
    status = HTTPStatus(exc.status_code)
    err_type = "invalid_request_error" if status < 500 else "server_error"
    response = create_error_response(message, err_type, status=status, code=None)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    """A bug, or the engine's failure outside a route's own handling: logged, and told as one sentence."""
    return server_error_response(exc)


def install_error_handlers(app: FastAPI, max_request_body_bytes: int, read_timeout: float) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
    app.add_middleware(RequestBodyLimitMiddleware, limit=max_request_body_bytes, timeout=read_timeout)
