"""The live page, ``GET /ui``: the engine's event stream drawn in the browser, while ``tracevllm serve``
runs or from a recorded run (``tracevllm traces view``).

    static/index.html   the page: plain HTML, CSS and JavaScript modules, no build step, no network
    static/stream.js    reads GET /v1/engine/events (fetch, so that it can send the API key)
    static/model.js     the engine as the events tell it: requests, queue, KV blocks, the last steps
    static/*.js         the panels, the KV grid and the charts, drawn from the model
    view.py             tracevllm traces view: a trace's events replayed as the stream (whose messages
                        are the live one's, ../openai/engine_events.py)

``mount_ui(app)`` adds the page to a FastAPI app. The page and its files hold no data of the engine's,
so they are open without the API key; the stream, which does, asks for it (the page prompts).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
UI_PATH = "/ui"


def is_ui_path(path: str) -> bool:
    """The page and its static files: open without the API key (they hold no data)."""
    return path == UI_PATH or path.startswith(UI_PATH + "/")


def mount_ui(app: FastAPI) -> None:
    """``GET /ui`` (the page) and ``/ui/static/*`` (its scripts and style) on ``app``."""

    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.add_api_route(UI_PATH, page, methods=["GET"], include_in_schema=False)
    app.mount(f"{UI_PATH}/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
