"""SamplingParams: how one request picks its next tokens, validated before anything is queued."""

from __future__ import annotations

import enum

import msgspec


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput of a request carries (vLLM's names)."""

    CUMULATIVE = 0  # all text and tokens so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    """vLLM's sampling parameters.

    ``temperature == 0`` means greedy. ``top_k == -1`` and ``top_p == 1`` and ``min_p == 0`` switch
    those filters off. Every field is checked in ``__post_init__`` (msgspec also runs it when the
    struct is decoded from another process), so a bad value raises ``ValueError`` naming the field
    and its allowed range before the request reaches the engine.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._verify()

    def _verify(self) -> None:
        def bad(field: str, allowed: str) -> ValueError:
            return ValueError(f"{field} must be {allowed}, got {getattr(self, field)!r}.")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "an integer >= 1")
        if self.temperature < 0.0:
            raise bad("temperature", "a float >= 0 (0 means greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1 or self.top_k == 0:
            raise bad("top_k", "-1 (disabled) or an integer >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "an integer >= 1 (or None for up to max_model_len)")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise bad("logprobs", "None or an integer >= 0")
        for field in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, field) <= 2.0:
                raise bad(field, "in [-2, 2]")
        if self.repetition_penalty <= 0.0:
            raise bad("repetition_penalty", "a float > 0 (1 disables it)")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a non-empty string or a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a list of non-negative token ids")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "None or an integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def clone(self, **changes) -> "SamplingParams":
        return msgspec.structs.replace(self, **changes)
