"""``tracevllm traces view DIR``: the live page on a recorded run.

The trace's spans are told again as the engine's events (``tracevllm/entrypoints/ui/recorded_events.py``) and sent as the same
stream ``tracevllm serve`` sends, ``GET /v1/engine/events`` (the same messages and filters:
``entrypoints/openai/engine_events.py``), with ``"source": "trace"`` in its Hello; ``GET /ui`` is the
same page. Each client gets the run from its start::

    load_trace(DIR) ─ trace_events ─ [(time, event)] ─ TraceReplay.stream ─ SSE ─ page
                                                          --speed 2: twice the recorded pace
                                                          --speed max: as fast as the page reads

At the end of the run the stream stays open (a comment now and then), so the browser does not
connect again and replay it from the start.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

import uvicorn
from fastapi import FastAPI, Query, Response
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse

from tracevllm.entrypoints.openai.engine_events import EventFilter, Hello, sse_message
from tracevllm.entrypoints.ui import UI_PATH, mount_ui
from tracevllm.tracing.schema import Attr, SpanName
from tracevllm.entrypoints.ui.recorded_events import trace_events
from viz.trace_loader import load_trace
from viz.model import Trace

KEEPALIVE_S = 15.0
YIELD_EVERY = 64  # at --speed max, let the server's other connections in every this many messages


def trace_hello(trace: Trace, jaeger_url: str | None) -> Hello:
    """The Hello of a recorded run: the engine's sizes from its start-up spans (or its steps)."""
    steps = trace.require_steps()
    startup: dict = {}  # the phases' attributes, one name each (a vLLM run has them all on EngineCore init)
    for s in trace.spans:
        if s.name in (SpanName.ALLOCATE_KV_CACHE, SpanName.ENGINE_CORE_INIT, SpanName.LOAD_MODEL):
            startup.update(s.attributes)
    block_sizes = [s.attributes[Attr.REQUEST_BLOCK_SIZE] for s in trace.spans
                   if s.name == SpanName.SCHEDULER_REQUEST and Attr.REQUEST_BLOCK_SIZE in s.attributes]
    block_size = startup.get(Attr.BLOCK_SIZE) or (block_sizes or [0])[0]
    max_num_seqs = startup.get(Attr.MAX_NUM_SEQS) or max(s.batch_size for s in steps)
    return Hello(num_gpu_blocks=steps[0].num_gpu_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                 max_num_batched_tokens=steps[0].token_budget, model=str(startup.get(Attr.MODEL, "")),
                 jaeger_url=jaeger_url,
                 step=-1, source="trace", num_null_blocks=trace.num_null_blocks)


class TraceReplay:
    """A trace's events, encoded once, sent to each client from the first, ``speed`` times the
    recorded pace (None: as fast as the client reads them)."""

    def __init__(self, trace: Trace, speed: float | None, jaeger_url: str | None = None) -> None:
        self.hello = sse_message(trace_hello(trace, jaeger_url))
        self.events = [(timed.time, timed.event, sse_message(timed.event)) for timed in trace_events(trace)]
        self.speed = speed

    async def stream(self, only: EventFilter) -> AsyncIterator[bytes]:
        yield self.hello
        loop = asyncio.get_running_loop()
        started, first = loop.time(), self.events[0][0]
        for i, (time, event, data) in enumerate(self.events):
            if self.speed is not None:
                delay = started + (time - first) / self.speed - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            elif i % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if only.wants(event):
                yield data
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            yield b": the recorded run is over\n\n"


def build_app(replay: TraceReplay) -> FastAPI:
    app = FastAPI(title="tracevllm traces view", docs_url=None, redoc_url=None, openapi_url=None)
    mount_ui(app)

    @app.get("/v1/engine/events")
    async def engine_events(types: Annotated[list[str] | None, Query()] = None,
                            request_id: str | None = None) -> Response:
        try:
            only = EventFilter.from_query(types, request_id)
        except ValueError as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error", "param": "types",
                                           "code": None}}, status_code=400)
        return StreamingResponse(replay.stream(only), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse(UI_PATH)

    return app


def parse_speed(text: str) -> float | None:
    """``--speed``: a positive number, or ``max`` (None)."""
    if text == "max":
        return None
    try:
        speed = float(text)
    except ValueError:
        speed = 0.0
    if not speed > 0:
        raise ValueError(f"--speed must be a positive number (times the recorded pace) or 'max', got {text!r}")
    return speed


def run(args: argparse.Namespace) -> int:
    speed = parse_speed(args.speed)
    trace = load_trace(args.directory)
    replay = TraceReplay(trace, speed, args.jaeger_url)
    pace = "as fast as the page reads" if speed is None else f"at {speed:g}x the recorded pace"
    print(f"Replaying {len(trace.steps)} engine steps and {len(trace.requests)} requests of {args.directory} {pace}: "
          f"open http://{args.host}:{args.port}{UI_PATH} (Ctrl-C to stop)", flush=True)
    # A stream never ends by itself: on Ctrl-C, close the open ones after a second.
    uvicorn.run(build_app(replay), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)
    return 0
