"""Errors the front end raises when the engine core cannot serve a request."""


class EngineGenerateError(Exception):
    """A request failed in the engine; the engine itself is still serving."""


class EngineDeadError(Exception):
    """The engine core is gone (its process died or its busy loop raised); no request can be served.

    The message carries the engine core's traceback when it had time to send one.
    """

    def __init__(self, detail: str = "") -> None:
        message = "The engine core died unexpectedly; see the server log for the cause."
        super().__init__(f"{message}\n{detail}" if detail else message)


class EngineShutdownError(Exception):
    """The server is shutting down: a request still running is stopped (aborted in the engine core),
    a new one refused. A client is told so, rather than having its stream cut mid-body."""

    def __init__(self) -> None:
        super().__init__("The server is shutting down; this request was stopped before it finished.")
