"""SamplingParams: how one request picks its next tokens, validated before anything is queued."""

from __future__ import annotations

import enum

import msgspec

from tracevllm.inputs.parse import lone_surrogate_at

# Every integer field ends up in an int64 tensor or numpy array, or crosses msgpack (whose ints
# stop at 2**64 - 1): each must fit in a signed 64-bit integer, or the engine would raise
# OverflowError mid-step. vLLM bounds a seed the same way (torch.Generator.manual_seed takes an int64).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# A temperature below this samples greedily, as in vLLM: dividing the logits by a much smaller (but
# positive) temperature could overflow them to inf and the softmax to NaN.
SAMPLING_EPS = 1e-5
# The float fields become float32 tensors: finiteness is checked in float32, where 1e39 is inf.
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
_BOOL_FIELDS = ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                "detokenize")
# A seen token's logit is divided or multiplied by the repetition penalty. Within [0.01, 100] a logit
# grows at most 100-fold (and 1e5-fold more under the smallest sampling temperature, 1e-5): any
# logit a model produces stays far below float32's 3.4e38. 1e-45 (a float32 denormal) made it inf.
_REPETITION_PENALTY_MIN, _REPETITION_PENALTY_MAX = 0.01, 100.0


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
        # Normalised only when of a type they may have; any other value stays, for _verify to name.
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, (list, tuple)):
            self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.output_kind, bool) and self.output_kind in tuple(RequestOutputKind):
            self.output_kind = RequestOutputKind(self.output_kind)  # 2 is FINAL_ONLY, as the enum's value
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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= _FLOAT32_MAX:
                raise bad(field, f"a finite number (used as a float32: at most {_FLOAT32_MAX:.6g} in magnitude)")
        if not _is_int(self.n, 1):
            raise bad("n", f"an integer in [1, {_INT64_MAX}]")
        if self.temperature < 0.0:
            raise bad("temperature", "a float >= 0 (0 means greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not (self.top_k == -1 or _is_int(self.top_k, 1)):
            raise bad("top_k", f"-1 (disabled) or an integer in [1, {_INT64_MAX}]")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if self.max_tokens is not None and not _is_int(self.max_tokens, 1):
            raise bad("max_tokens", f"an integer in [1, {_INT64_MAX}] (or None for up to max_model_len)")
        if not _is_int(self.min_tokens, 0):
            raise bad("min_tokens", f"an integer in [0, {_INT64_MAX}]")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        for field in ("logprobs", "prompt_logprobs"):
            if getattr(self, field) is not None and not _is_int(getattr(self, field), 0):
                raise bad(field, f"None or an integer in [0, {_INT64_MAX}]")
        for field in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, field) <= 2.0:
                raise bad(field, "in [-2, 2]")
        if not _REPETITION_PENALTY_MIN <= self.repetition_penalty <= _REPETITION_PENALTY_MAX:
            low, high = _REPETITION_PENALTY_MIN, _REPETITION_PENALTY_MAX
            raise bad("repetition_penalty", f"in [{low:g}, {high:g}] (1 disables it)")
        if not isinstance(self.stop, list) or any(not _is_text(s) or not s for s in self.stop):
            raise bad("stop", "a non-empty string or a list of non-empty strings (valid Unicode)")
        if not isinstance(self.stop_token_ids, list) or any(not _is_int(t, 0) for t in self.stop_token_ids):
            raise bad("stop_token_ids", f"a list of token ids in [0, {_INT64_MAX}]")
        for field in _BOOL_FIELDS:
            if not isinstance(getattr(self, field), bool):
                raise bad(field, "True or False")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise bad("output_kind", "a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY)")
        if self.seed is not None and not _is_int(self.seed, _INT64_MIN):
            raise bad("seed", f"None or an integer in [{_INT64_MIN}, {_INT64_MAX}]")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (they are found in the text).")
        if self.bad_words is not None and (
            not isinstance(self.bad_words, list) or any(not _is_text(w) or not w.strip() for w in self.bad_words)
        ):
            raise bad("bad_words", "a list of non-blank strings (valid Unicode)")
        if self.bad_words_token_ids is not None and any(
            not word or any(not _is_int(t, 0) for t in word) for word in self.bad_words_token_ids
        ):
            raise bad("bad_words_token_ids", f"a list of non-empty lists of token ids in [0, {_INT64_MAX}]")
        if self.truncate_prompt_tokens is not None and not (
            self.truncate_prompt_tokens == -1 or _is_int(self.truncate_prompt_tokens, 1)
        ):
            raise bad("truncate_prompt_tokens", f"None, -1 (as many as fit) or an integer in [1, {_INT64_MAX}]")

    @property
    def greedy(self) -> bool:
        """The argmax, not a draw: a temperature below ``SAMPLING_EPS`` (the Sampler's rule too)."""
        return self.temperature < SAMPLING_EPS

    def clone(self, **changes) -> "SamplingParams":
        return msgspec.structs.replace(self, **changes)


def _is_int(value: object, low: int) -> bool:
    """``value`` is an int (not a bool) in ``[low, 2**63 - 1]``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= _INT64_MAX


def _is_text(value: object) -> bool:
    """``value`` is a str with no lone surrogate (``inputs/parse.py``'s ``lone_surrogate_at``)."""
    return isinstance(value, str) and lone_surrogate_at(value) is None
