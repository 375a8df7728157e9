"""The live page, ``GET /ui``: the engine's event stream drawn in the browser, while ``tracevllm serve``
runs or from a recorded run (``tracevllm traces view``).

    static/index.html   the page: plain HTML, CSS and JavaScript modules, no build step, no network
    static/stream.js    reads GET /v1/engine/events (fetch, so that it can send the API key)
    static/model.js     the engine as the events tell it: requests, queue, KV blocks, the last steps
    static/*.js         the panels, the KV grid and the charts, drawn from the model
    palette.css, .js    the colours of the phases and the why parts, written from ``viz/palette.py``
                        (the figures' and the report's palette) when the page asks for them
    view.py             tracevllm traces view: a trace's events replayed as the stream (whose messages
                        are the live one's, ../openai/engine_events.py)

``mount_ui(app)`` adds the page to a FastAPI app. The page and its files hold no data of the engine's,
so they are open without the API key; the stream, which does, asks for it (the page prompts).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from viz.palette import palette_css, palette_js

STATIC_DIR = Path(__file__).parent / "static"
UI_PATH = "/ui"


def is_ui_path(path: str) -> bool:
    """The page and its static files: open without the API key (they hold no data)."""
    return path == UI_PATH or path.startswith(UI_PATH + "/")


def mount_ui(app: FastAPI) -> None:
    """``GET /ui`` (the page), ``/ui/palette.css`` and ``/ui/palette.js`` (its colours) and
    ``/ui/static/*`` (its scripts and style) on ``app``."""

    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def css() -> Response:
        return Response(palette_css(), media_type="text/css")

    async def js() -> Response:
        return Response(palette_js(), media_type="text/javascript")

    app.add_api_route(UI_PATH, page, methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/palette.css", css, methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/palette.js", js, methods=["GET"], include_in_schema=False)
    app.mount(f"{UI_PATH}/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
