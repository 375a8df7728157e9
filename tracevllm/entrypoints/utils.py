"""Helpers for the HTTP routes: cancel a handler whose client left, merge several streams."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


async def listen_for_disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so only disconnects come)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def with_cancellation(handler):
    """Run the route handler, but cancel it if the client disconnects first.

    Cancelling the handler cancels the ``AsyncLLM.generate()`` it awaits, which aborts the request in
    the engine core and frees its KV blocks. The handler must take the request as ``raw_request``.
    Streaming responses need no such help: Starlette stops the stream when a write fails.
    """

    @functools.wraps(handler)
    async def wrapper(*args, **kwargs):
        handler_task = asyncio.create_task(handler(*args, **kwargs))
        disconnect_task = asyncio.create_task(listen_for_disconnect(kwargs["raw_request"]))
        done, pending = await asyncio.wait([handler_task, disconnect_task], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if handler_task in done:
            return handler_task.result()
        return None

    return wrapper


async def merge_async_iterators(*iterators: AsyncIterator[T]) -> AsyncGenerator[tuple[int, T], None]:
    """Yield ``(index of the iterator, item)`` from all iterators as items come; closing the merged
    generator cancels the ones still running."""
    loop = asyncio.get_running_loop()
    pending = {loop.create_task(anext(it)): i for i, it in enumerate(iterators)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[loop.create_task(anext(iterators[i]))] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
