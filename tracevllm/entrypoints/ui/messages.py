"""The engine-event stream's messages: what ``GET /v1/engine/events`` sends, live from ``tracevllm
serve`` or replayed from a trace by ``tracevllm traces view``, and what the page (``static/``) reads.

Each message is one Server-Sent Event, ``data: <json>\\n\\n``, whose object is one engine event of
``tracevllm/core/events.py``: ``{"type": <its class name>, <its fields by name>}``, nested structs
(a ``StepRecord``'s ``batch`` and ``gauges``) as objects and bytes (block hashes) as hex. Two
messages are the stream's own::

    Hello     first, on connect: what the page needs to draw before any event (the KV cache's size,
              the scheduler's limits), the last step recorded so far (-1: none) and the source
    Dropped   last, to a client that fell behind; then the stream closes

The query ``types=StepRecord,RequestFinished`` keeps those classes only; ``request_id=R`` keeps R's
events, and the step records whose batch ran or preempted R (``MessageFilter``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from tracevllm.core import events

# Every event class a client may ask for by name (``types=``), and the stream's own two messages.
EVENT_TYPES = frozenset(name for name, value in vars(events).items()
                        if isinstance(value, type) and issubclass(value, msgspec.Struct) and value.__struct_config__.tag)


class Hello(msgspec.Struct, tag=True):
    """The first message: the engine the stream comes from."""

    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    model: str
    jaeger_url: str | None
    step: int  # the last step recorded so far; -1 if none
    source: Literal["live", "trace"]


class Dropped(msgspec.Struct, tag=True):
    """The last message to a client that fell behind: its queue was full, so the stream ends."""

    reason: str


STREAM_TYPES = frozenset({"Hello", "Dropped"})


def _plain(value: object) -> object:
    """``value`` as JSON's types: a struct as an object of its fields, bytes as hex."""
    if isinstance(value, msgspec.Struct):
        return {name: _plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def event_message(event: msgspec.Struct) -> dict:
    """An engine event (or ``Hello``, ``Dropped``) as the stream's message: its type, then its fields."""
    return {"type": type(event).__name__, **_plain(event)}  # type: ignore[dict-item]


def sse(message: dict) -> bytes:
    """One Server-Sent Event carrying ``message``."""
    return b"data: " + msgspec.json.encode(message) + b"\n\n"


class MessageFilter:
    """The query's filters. ``types``: comma-separated class names (ValueError naming an unknown one);
    ``request_id``: that request's events, and the step records that ran or preempted it. Hello and
    Dropped always pass."""

    def __init__(self, types: str | None = None, request_id: str | None = None) -> None:
        self.types = None
        if types:
            self.types = frozenset(t.strip() for t in types.split(",") if t.strip())
            if unknown := sorted(self.types - EVENT_TYPES):
                raise ValueError(f"types: unknown event type {', '.join(unknown)}; the types are "
                                 f"{', '.join(sorted(EVENT_TYPES))}")
        self.request_id = request_id or None

    def passes(self, message: dict) -> bool:
        kind = message["type"]
        if kind in STREAM_TYPES:
            return True
        if self.types is not None and kind not in self.types:
            return False
        if self.request_id is None:
            return True
        if kind == "StepRecord":
            batch = message.get("batch") or {"scheduled": [], "preempted_request_ids": []}
            return (any(s["request_id"] == self.request_id for s in batch["scheduled"])
                    or self.request_id in batch["preempted_request_ids"])
        return message.get("request_id") == self.request_id
