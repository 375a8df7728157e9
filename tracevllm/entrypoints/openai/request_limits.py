"""What one request may ask of the server (``RequestLimits``, ``DEFAULT_MAX_REQUEST_BODY_BYTES``) and the
error a bad request becomes (``RequestError``).

Kept apart from the serving code, with nothing heavier than the standard library, because
``tracevllm serve --help`` shows these defaults: building the command line must not load FastAPI,
the engine or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracevllm.entrypoints.openai.protocol import SamplingFields

DEFAULT_MAX_REQUEST_BODY_BYTES = 4 * 1024 * 1024


class RequestError(ValueError):
    """A bad request: becomes HTTP ``status`` with OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


@dataclass(frozen=True)
class RequestLimits:
    """How much one request may ask of the server (each a ``serve`` flag), checked before any
    tokenization: the engine's cost grows with each of these, and none has a bound of its own."""

    max_n: int = 128  # OpenAI's cap: each sample is a sequence in the batch
    max_prompts: int = 128  # per /v1/completions request: each is a request in the engine
    max_stop_strings: int = 64  # each one is searched for in the new text of every step
    max_stop_chars: int = 16 * 1024  # their total length (one of 1 MB took seconds; docs/perf-log.md)
    max_stop_token_ids: int = 1024

    def check(self, request: SamplingFields, num_prompts: int = 1) -> None:
        if request.n > self.max_n:
            raise RequestError(f"n must be at most {self.max_n} (the server's --max-n), got {request.n}.", param="n")
        if num_prompts > self.max_prompts:
            raise RequestError(f"A request may have at most {self.max_prompts} prompts (the server's --max-prompts), "
                               f"got {num_prompts}.", param="prompt")
        stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
        # Bad words are bounded as stop strings are: each is tokenized when the request is added, and
        # checked against the output at every step.
        for field, words in (("stop", stop), ("bad_words", request.bad_words or [])):
            if len(words) > self.max_stop_strings:
                raise RequestError(f"{field} may have at most {self.max_stop_strings} strings (the server's "
                                   f"--max-stop-strings), got {len(words)}.", param=field)
            if sum(map(len, words)) > self.max_stop_chars:
                raise RequestError(f"{field} may have at most {self.max_stop_chars} characters in all (the "
                                   f"server's --max-stop-chars), got {sum(map(len, words))}.", param=field)
        if len(request.stop_token_ids or ()) > self.max_stop_token_ids:
            raise RequestError(f"stop_token_ids may have at most {self.max_stop_token_ids} ids (the server's "
                               f"--max-stop-token-ids), got {len(request.stop_token_ids)}.", param="stop_token_ids")
