"""The OpenAI-compatible server, started by ``tracevllm serve``.

    run_server(args)
      ├─ create_server_socket()            bind the port first: a busy port fails before loading
      ├─ build_async_engine_client(args)   AsyncLLM, i.e. the EngineCore process; owns its lifetime
      ├─ build_app(args)                   FastAPI routes, error handlers, API-key middleware
      ├─ init_app_state(engine, state)     OpenAIServingModels / Chat / Completion on app.state, and
                                           the engine events' fan-out (engine_events.py)
      └─ serve_http(app, sock)             uvicorn (each request's head and body on a deadline,
                                           and at most --shutdown-timeout seconds to drain on
                                           exit), plus background tasks: the periodic stats log
                                           line, a watchdog that stops the server (exit code 1)
                                           when the engine core has died, and one that ends the
                                           engine event streams and stops the requests in flight
                                           (an error event and [DONE], or a 503) when it exits
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import secrets
import signal
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Annotated

import uvicorn
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

import tracevllm
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.engine.async_llm import AsyncLLM
from tracevllm.engine.exceptions import EngineDeadError, EngineGenerateError, EngineShutdownError
from tracevllm.entrypoints.openai.protocol import (
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
)
from tracevllm.entrypoints.openai.engine_events import EngineEventFanOut, EventFilter, EventStreamResponse, Hello
from tracevllm.entrypoints.openai.header_timeout import H11ProtocolWithHeaderTimeout
from tracevllm.entrypoints.openai.http_errors import install_error_handlers
from tracevllm.entrypoints.openai.serving_chat import OpenAIServingChat
from tracevllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from tracevllm.entrypoints.openai.serving_engine import (
    RequestLimits, create_error_response, error_from_exception, server_error_response,
)
from tracevllm.entrypoints.openai.serving_models import OpenAIServingModels
from tracevllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from tracevllm.entrypoints.openai.tokenizer_lanes import TokenizerLanes
from tracevllm.entrypoints.ui import UI_PATH, is_ui_path, mount_ui
from tracevllm.entrypoints.utils import with_cancellation
from tracevllm.tracing.http import Span, end_server_span, server_span_headers, start_server_span
from tracevllm.utils import configure_logging

logger = logging.getLogger("tracevllm")

STATS_LOG_INTERVAL_S = 10.0
WATCHDOG_INTERVAL_S = 0.5
STOP_BEFORE_DEADLINE_S = 1.0  # how long before --shutdown-timeout runs out the requests left are stopped

router = APIRouter()


def engine_client(request: Request) -> AsyncLLM:
    return request.app.state.engine_client


@router.api_route("/health", methods=["GET", "HEAD"])  # load balancers' probes often use HEAD
async def health(raw_request: Request) -> Response:
    try:
        await engine_client(raw_request).check_health()
    except EngineDeadError:
        return Response(status_code=HTTPStatus.SERVICE_UNAVAILABLE)
    return Response(status_code=HTTPStatus.OK)


@router.get("/version")
async def show_version() -> JSONResponse:
    return JSONResponse({"version": tracevllm.__version__})


@router.get("/v1/models")
async def show_available_models(raw_request: Request) -> JSONResponse:
    return JSONResponse(raw_request.app.state.openai_serving_models.show_available_models().model_dump())


@router.get("/metrics")
async def metrics(raw_request: Request) -> Response:
    prometheus = engine_client(raw_request).prometheus
    if prometheus is None:
        return create_error_response("Metrics are off (--disable-log-stats).", status=HTTPStatus.NOT_FOUND)
    return Response(prometheus.generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/engine/events")
async def engine_events(raw_request: Request, types: Annotated[list[str] | None, Query()] = None,
                        request_id: str | None = None) -> Response:
    """The engine core's events, live, as Server-Sent Events (engine_events.py)."""
    try:
        event_filter = EventFilter.from_query(types, request_id)
    except ValueError as e:
        return create_error_response(str(e), param="types")
    if engine_client(raw_request).errored:
        return create_error_response("The engine core is dead.", "server_error", status=HTTPStatus.SERVICE_UNAVAILABLE)
    fan_out: EngineEventFanOut = raw_request.app.state.engine_events
    return EventStreamResponse(fan_out, fan_out.subscribe(event_filter))


@router.post("/v1/chat/completions")
@with_cancellation
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
    handler = raw_request.app.state.openai_serving_chat
    return await _respond(raw_request, lambda trace_headers: handler.create_chat_completion(request, trace_headers))


@router.post("/v1/completions")
@with_cancellation
async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
    handler = raw_request.app.state.openai_serving_completion
    return await _respond(raw_request, lambda trace_headers: handler.create_completion(request, trace_headers))


@router.post("/tokenize")
async def tokenize(request: TokenizeRequest, raw_request: Request) -> Response:
    handler = raw_request.app.state.openai_serving_tokenization
    return await _respond(raw_request, lambda _: handler.create_tokenize(request))


@router.post("/detokenize")
async def detokenize(request: DetokenizeRequest, raw_request: Request) -> Response:
    handler = raw_request.app.state.openai_serving_tokenization
    return await _respond(raw_request, lambda _: handler.create_detokenize(request))


async def _respond(raw_request: Request, call: Callable[[dict | None], Awaitable]) -> Response:
    """A JSON body, an SSE stream, or an error in OpenAI's shape; all inside the request's SERVER
    span when tracing is on (its ``traceparent`` is what ``call`` gets to parent its spans)."""
    span = start_server_span(engine_client(raw_request).request_tracer, raw_request)
    try:
        result = await call(server_span_headers(span))
    except ValueError as e:
        response = error_from_exception(e)
    except (EngineDeadError, EngineGenerateError, EngineShutdownError) as e:
        response = server_error_response(e)
    except BaseException:  # cancelled (the client left) or a bug
        end_server_span(span, None)
        raise
    else:
        if not hasattr(result, "model_dump"):
            return StreamingResponse(_end_span_with_stream(result, span), media_type="text/event-stream")
        response = JSONResponse(result.model_dump())
    end_server_span(span, response.status_code)
    return response


async def _end_span_with_stream(stream: AsyncGenerator[str, None], span: Span | None) -> AsyncGenerator[str, None]:
    try:
        async for chunk in stream:
            yield chunk
    finally:
        end_server_span(span, HTTPStatus.OK)


class AuthenticationMiddleware:
    """With ``--api-key``, every route but ``/health`` and the page wants ``Authorization: Bearer <key>``
    (else 401): ``/tokenize`` runs the tokenizer, ``/metrics`` and ``/version`` describe the server, and
    the docs list every route. ``/health`` stays open for load balancers and orchestrators, and ``/ui``
    (the page and its scripts, no data) for a browser, which cannot send the header when it opens a
    page: the page sends it with its requests for the stream.

    The header is compared as bytes, in constant time: it need not be UTF-8 (a byte like 0xff is a
    401, not a decoding error), and the time taken tells nothing about how much of the key matched.

    A plain ASGI middleware (not Starlette's BaseHTTPMiddleware), so streaming and disconnect
    detection pass through untouched.
    """

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and not is_ui_path(scope["path"]):
            headers = dict(scope["headers"])
            if not secrets.compare_digest(headers.get(b"authorization", b""), self.expected):
                response = create_error_response(
                    "Incorrect API key provided.", status=HTTPStatus.UNAUTHORIZED, code="invalid_api_key"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(args: argparse.Namespace) -> FastAPI:
    if args.disable_fastapi_docs:
        app = FastAPI(title="tracevllm", version=tracevllm.__version__, docs_url=None, redoc_url=None,
                      openapi_url=None)
    else:
        app = FastAPI(title="tracevllm", version=tracevllm.__version__)
    app.include_router(router)
    mount_ui(app)
    install_error_handlers(app, args.max_request_body_bytes, args.read_timeout)
    if args.api_key:
        app.add_middleware(AuthenticationMiddleware, api_key=args.api_key)
    return app


async def init_app_state(engine: AsyncLLM, state, args: argparse.Namespace) -> None:
    model_config = await engine.get_model_config()
    state.engine_client = engine
    state.openai_serving_models = OpenAIServingModels(model_config)
    tokenizer_lanes = TokenizerLanes()  # shared by all the routes
    limits = RequestLimits(args.max_n, args.max_prompts, args.max_stop_strings, args.max_stop_chars,
                           args.max_stop_token_ids)
    state.openai_serving_chat = OpenAIServingChat(engine, state.openai_serving_models, tokenizer_lanes, limits)
    state.openai_serving_completion = OpenAIServingCompletion(
        engine, state.openai_serving_models, tokenizer_lanes, limits
    )
    state.openai_serving_tokenization = OpenAIServingTokenization(
        engine, state.openai_serving_models, state.openai_serving_chat
    )
    config = engine.vllm_config
    state.engine_events = EngineEventFanOut(engine.engine_core, Hello(
        engine.engine_core.num_gpu_blocks, config.cache_config.block_size, config.scheduler_config.max_num_seqs,
        engine.engine_core.max_num_batched_tokens, model_config.served_model_name, args.jaeger_url, step=-1))


@asynccontextmanager
async def build_async_engine_client(args: argparse.Namespace) -> AsyncIterator[AsyncLLM]:
    """The engine for the server's lifetime; its process is shut down however the server ends."""
    engine = AsyncLLM.from_engine_args(EngineArgs.from_cli_args(args), log_stats=not args.disable_log_stats)
    try:
        yield engine
    finally:
        await engine.wait_until_idle(STOP_BEFORE_DEADLINE_S)  # the requests stopped at exit: aborted by now
        engine.shutdown()


def create_server_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def serve_http(app: FastAPI, sock: socket.socket, engine: AsyncLLM, log_stats: bool, **uvicorn_kwargs) -> int:
    """Serve until SIGINT/SIGTERM (exit code 0) or until the engine core dies (exit code 1)."""
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_kwargs))
    exit_code = 0

    async def watchdog() -> None:
        nonlocal exit_code
        while not engine.errored:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
        logger.error("The engine core died; in-flight requests failed. Shutting the server down.")
        exit_code = 1
        server.should_exit = True

    async def end_streams_on_exit() -> None:
        # uvicorn lets open responses finish for --shutdown-timeout before it exits, then cuts them
        # off mid-body. An event stream never ends by itself: it ends now. A generation still running
        # shortly before that deadline is stopped, its client told why (an error event and [DONE],
        # or a 503), its request aborted and its spans ended as aborted.
        while not server.should_exit:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
        app.state.engine_events.shutdown()
        await asyncio.sleep(max(0.0, (server.config.timeout_graceful_shutdown or 0.0) - STOP_BEFORE_DEADLINE_S))
        await engine.stop_for_shutdown()

    async def log_stats_periodically() -> None:
        while True:
            await asyncio.sleep(STATS_LOG_INTERVAL_S)
            await engine.do_log_stats()

    # uvicorn turns SIGINT/SIGTERM into a graceful shutdown and then re-raises the signal with the
    # handler found before it started; make that one a no-op so that the engine core is shut down
    # by build_async_engine_client and the process exits normally (code 0).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    tasks = [asyncio.create_task(watchdog()), asyncio.create_task(end_streams_on_exit())]
    if log_stats:
        tasks.append(asyncio.create_task(log_stats_periodically()))
    try:
        await server.serve(sockets=[sock])
    finally:
        for task in tasks:
            task.cancel()
    return exit_code


async def run_server(args: argparse.Namespace) -> int:
    try:
        sock = create_server_socket(args.host, args.port)
    except OSError as e:
        logger.error("Cannot listen on %s:%d: %s", args.host, args.port, e.strerror or e)
        return 1
    logger.info("Loading model %s and starting the engine core...", args.model or "(bundled SmolLM2-135M-Instruct)")
    async with build_async_engine_client(args) as engine:
        app = build_app(args)
        await init_app_state(engine, app.state, args)
        cache = engine.vllm_config.cache_config
        num_blocks = engine.engine_core.num_gpu_blocks
        logger.info("KV cache: %d blocks of %d tokens (%d tokens, block 0 the null block); max_model_len %d",
                    num_blocks, cache.block_size, (num_blocks - 1) * cache.block_size,
                    engine.model_config.max_model_len)
        trace_to = getattr(args, "trace_out", None) or getattr(args, "otlp_traces_endpoint", None)
        if trace_to:
            logger.info("Traces go to %s", trace_to)
        logger.info("Serving %s at http://%s:%d (Ctrl-C to stop)", engine.model_config.served_model_name,
                    args.host, args.port)
        logger.info("Live view of the engine: http://%s:%d%s", args.host, args.port, UI_PATH)
        return await serve_http(
            app, sock, engine, log_stats=not args.disable_log_stats, host=args.host, port=args.port,
            log_level=args.uvicorn_log_level, timeout_keep_alive=5,
            http=functools.partial(H11ProtocolWithHeaderTimeout, header_timeout=args.read_timeout),
            timeout_graceful_shutdown=args.shutdown_timeout,
        )


def main(args: argparse.Namespace) -> int:
    configure_logging()
    return asyncio.run(run_server(args))
