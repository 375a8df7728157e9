"""SamplingParams: how one request picks its next tokens, validated before anything is queued."""

from __future__ import annotations

import enum
import math

import msgspec

# vLLM bounds a seed to a signed 64-bit integer (what torch.Generator.manual_seed and msgpack take).
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput of a request carries (vLLM's names)."""

    CUMULATIVE = 0  # all text and tokens so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    """vLLM's sampling parameters.

    ``temperature == 0`` means greedy. ``top_k == -1`` and ``top_p == 1`` and ``min_p == 0`` switch
    those filters off. ``seed == -1`` means no seed, as in vLLM. ``detokenize=False``: the outputs
    carry token ids and no text (so no stop strings). ``bad_words``: words the output may not
    contain; the Processor turns them into ``bad_words_token_ids`` (the sampler bans a word's last
    token when the output ends with the rest of it). ``truncate_prompt_tokens``: keep only the
    prompt's last k tokens (-1: as many as fit). ``logprobs=k``: each generated position's logprob
    and the top k; ``prompt_logprobs=k`` the same for every prompt position after the first (the
    model's logprob of the prompt's own next token, and the top k there). Every field is checked in ``__post_init__`` (msgspec also runs it when the
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
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    bad_words: str | list[str] | None = None
    bad_words_token_ids: list[list[int]] | None = None  # filled in by the Processor from bad_words
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.seed == -1:
            self.seed = None
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]  # one word, as a lone stop string is
        if isinstance(self.bad_words, list) and all(isinstance(w, str) for w in self.bad_words):
            self.bad_words = list(dict.fromkeys(self.bad_words))
        self._verify()

    def _verify(self) -> None:
        def bad(field: str, allowed: str) -> ValueError:
            return ValueError(f"{field} must be {allowed}, got {getattr(self, field)!r}.")

        for field in _FLOAT_FIELDS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(field, "a finite number")
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
        if self.seed is not None and (not isinstance(self.seed, int) or not _SEED_MIN <= self.seed <= _SEED_MAX):
            raise bad("seed", f"None or an integer in [{_SEED_MIN}, {_SEED_MAX}]")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (they are found in the text).")
        if self.bad_words is not None and (
            not isinstance(self.bad_words, list) or any(not isinstance(w, str) or not w.strip() for w in self.bad_words)
        ):
            raise bad("bad_words", "a list of non-blank strings")
        if self.bad_words_token_ids is not None and any(
            not word or any(not isinstance(t, int) or t < 0 for t in word) for word in self.bad_words_token_ids
        ):
            raise bad("bad_words_token_ids", "a list of non-empty lists of non-negative token ids")
        if self.truncate_prompt_tokens is not None and (
            not isinstance(self.truncate_prompt_tokens, int) or not (
                self.truncate_prompt_tokens == -1 or self.truncate_prompt_tokens >= 1)
        ):
            raise bad("truncate_prompt_tokens", "None, -1 (as many as fit) or an integer >= 1")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < 0):
            raise bad("prompt_logprobs", "None or an integer >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def clone(self, **changes) -> "SamplingParams":
        return msgspec.structs.replace(self, **changes)
