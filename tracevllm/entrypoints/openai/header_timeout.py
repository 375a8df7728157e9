"""H11ProtocolWithHeaderTimeout: uvicorn's HTTP/1.1 protocol with a deadline for each request's head.

uvicorn times a connection out only between requests: its keep-alive timer starts when a response
is complete and stops at the first byte of the next request. Before the first request, and from
the first byte of any request on, nothing is timed. So a client that sends ``GET / HTTP/1.1\\r\\nHo``
and then nothing keeps its connection (a socket, a file descriptor, a protocol object) for ever, and
a few thousand such clients (slowloris) use up the server. h11 bounds the head's size
(``h11_max_incomplete_event_size``, 16 KiB by default), not the time it takes to arrive.

Here the request line and headers must have arrived within ``header_timeout`` seconds of the
connection's start, or of the end of the previous response on it; if not, the connection is closed
without an answer. (The body has its own deadline: RequestBodyLimitMiddleware, in http_errors.)
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class H11ProtocolWithHeaderTimeout(H11Protocol):
    """Pass ``functools.partial(H11ProtocolWithHeaderTimeout, header_timeout=...)`` as uvicorn's ``http``."""

    def __init__(self, *args, header_timeout: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # h11 has parsed the whole head: a Request
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # the next request's head
            self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _start_header_timer(self) -> None:
        self._cancel_header_timer()
        # The keep-alive handler does what is needed: tell h11 the connection is closed, close it.
        self.header_timer = self.loop.call_later(self.header_timeout, self.timeout_keep_alive_handler)

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
