"""Processor: a user's prompt and sampling parameters in, validated EngineCoreRequests out.

Shared by both front ends (LLMEngine and AsyncLLM): ``process_request`` tokenizes and validates
(``process_inputs``), and fans a request with ``n > 1`` out into n engine-core requests
``"{i}_{request_id}"`` under one ``ParentRequest``. The n samples are ``ChildRequests``, made on
demand: a request with a huge n costs nothing until its samples are sent, and AsyncLLM sends them in
chunks it can stop at any moment.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import overload

import msgspec

from tracevllm.config import VllmConfig
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.output_processor import ParentRequest
from tracevllm.inputs import PromptType, parse_singleton_prompt
from tracevllm.sampling_params import SamplingParams

__all__ = ["MAX_LOGPROBS", "ChildRequests", "Processor", "PromptType"]

MAX_LOGPROBS = 20  # the most top logprobs a position may ask for (vLLM's default max_logprobs)
_INT64_MIN = -(2**63)


def child_seed(seed: int, index: int) -> int:
    """Sample ``index``'s seed: ``seed + index`` wrapped into the signed 64-bit range (two's
    complement), where every seed must lie (torch.Generator.manual_seed takes an int64). So
    ``seed=2**63 - 1`` gives samples 2**63 - 1, -2**63, -2**63 + 1, ...: distinct, and each a seed
    the client could have sent."""
    return (seed + index - _INT64_MIN) % 2**64 + _INT64_MIN


class ChildRequests(Sequence[EngineCoreRequest]):
    """The n engine-core requests of one user request, each made when it is asked for.

    With n = 1 the one item is ``request`` itself; with n > 1 item i is ``request`` renamed
    ``"{i}_{request_id}"`` with n = 1 and, for a seeded request, ``child_seed(seed, i)``. Nothing is
    built up front: indexing (an int or a slice) makes the items asked for, so a front end decides how
    many samples exist at once.
    """

    def __init__(self, request: EngineCoreRequest, n: int) -> None:
        self.request = request
        self.n = n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, index: int) -> EngineCoreRequest: ...

    @overload
    def __getitem__(self, index: slice) -> list[EngineCoreRequest]: ...

    def __getitem__(self, index: int | slice) -> EngineCoreRequest | list[EngineCoreRequest]:
        if isinstance(index, slice):
            return [self._make(i) for i in range(*index.indices(self.n))]
        if not -self.n <= index < self.n:
            raise IndexError(f"sample {index} of a request with n = {self.n}")
        return self._make(index % self.n)

    def _make(self, i: int) -> EngineCoreRequest:
        if self.n == 1:
            return self.request
        params = self.request.sampling_params
        seed = None if params.seed is None else child_seed(params.seed, i)
        return msgspec.structs.replace(
            self.request, request_id=f"{i}_{self.request.request_id}", sampling_params=params.clone(n=1, seed=seed),
        )


def max_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes one token of ``tokenizer`` stands for: its longest token decoded alone,
    special tokens included.

    A sound bound for byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2): such a tokenizer loses nothing,
    a text is the concatenation of its tokens' bytes, and a token decoded alone gives at least its
    own bytes (a piece of a UTF-8 character decodes to one U+FFFD, 3 bytes, for at most 3 bytes). A
    SentencePiece ``▁`` is a space its decoder strips at the start of a text: it is counted back.
    It is no bound for a tokenizer that shrinks a text as it reads it: a normalizer that folds
    characters (NFKC makes the 3-byte full-width "Ａ" an "A") or an unknown token that swallows a
    whole word (WordPiece's ``[UNK]``) lets a text hold more bytes than its tokens decode to.
    """
    ids = range(len(tokenizer))
    decoded = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    return max(len(text.encode("utf-8", "surrogatepass")) + str(piece).startswith("▁")
               for text, piece in zip(decoded, pieces))


class Processor:
    """``max_prompt_bytes``: the longest text (in UTF-8 bytes) that could fit in ``max_model_len``
    tokens, ``max_model_len x max_token_bytes(tokenizer)``. ``check_prompt_bytes`` refuses a longer
    one before a tokenizer spends time on it: the Processor's, before it tokenizes a text prompt, and
    the server's, before it tokenizes one itself."""

    def __init__(self, vllm_config: VllmConfig, tokenizer) -> None:
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab_size = vllm_config.model_config.vocab_size
        self.tokenizer = tokenizer
        self.max_token_bytes = max_token_bytes(tokenizer)
        self.max_prompt_bytes = self.max_model_len * self.max_token_bytes

    def check_prompt_bytes(self, text: str) -> None:
        """ValueError if ``text`` is too long in bytes to fit in ``max_model_len`` tokens."""
        if 4 * len(text) <= self.max_prompt_bytes:  # a character is at most 4 bytes: no need to count
            return
        num_bytes = len(text.encode("utf-8", "surrogatepass"))
        if num_bytes > self.max_prompt_bytes:
            raise ValueError(
                f"The prompt is {num_bytes} bytes long; max_model_len ({self.max_model_len}) tokens of this "
                f"tokenizer hold at most {self.max_prompt_bytes} bytes ({self.max_token_bytes} bytes per "
                f"token), so it cannot fit."
            )

    def process_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
        add_special_tokens: bool = True, arrival_time: float | None = None, messages: list[dict] | None = None,
    ) -> tuple[ParentRequest, ChildRequests]:
        """Validate and tokenize without queueing anything (raises ValueError on bad input). Returns
        the user request and its n engine-core requests, made as they are read (``ChildRequests``).

        ``arrival_time``: when the request reached the front end (default: now; the server passes
        the moment it began reading the request, before its chat template and tokenizer ran).
        ``messages``: the conversation a chat request was rendered from.
        """
        arrival_time = time.time() if arrival_time is None else arrival_time
        prompt_text, request = self.process_inputs(
            request_id, prompt, params, arrival_time, priority, add_special_tokens=add_special_tokens,
        )
        parent = ParentRequest(
            request_id, prompt_text, request.prompt_token_ids, request.sampling_params, arrival_time, messages,
        )
        return parent, ChildRequests(request, params.n)

    def process_inputs(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        add_special_tokens: bool = True,
    ) -> tuple[str | None, EngineCoreRequest]:
        """Tokenize and validate. Returns the prompt text (None for token-id prompts given without
        their text) and the request.

        ``params.truncate_prompt_tokens`` keeps the prompt's last k tokens (-1: the longest prompt
        that still leaves room to generate); ``params.bad_words`` become token-id sequences here.
        ``params.max_tokens`` of None becomes "up to max_model_len". ``add_special_tokens=False`` for
        text that already has them (a rendered chat template starts with its own BOS). Raises
        ValueError on bad input.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}.")
        arrival_time = time.time() if arrival_time is None else arrival_time
        for field in ("logprobs", "prompt_logprobs"):
            if (getattr(params, field) or 0) > MAX_LOGPROBS:
                raise ValueError(f"{field} must be at most {MAX_LOGPROBS}, got {getattr(params, field)}.")
        self._validate_params_with_vocab(params)
        prompt_text, prompt_token_ids = self._tokenize(prompt, add_special_tokens)
        if params.truncate_prompt_tokens is not None:
            keep = params.truncate_prompt_tokens if params.truncate_prompt_tokens != -1 else self.max_model_len - 1
            prompt_token_ids = prompt_token_ids[-keep:]
        self._validate_prompt(prompt_token_ids)
        if params.bad_words:
            params = params.clone(bad_words_token_ids=self._bad_words_token_ids(params.bad_words))
        elif params.bad_words_token_ids and any(t >= self.vocab_size for w in params.bad_words_token_ids for t in w):
            raise ValueError(f"bad_words_token_ids must be token ids in [0, {self.vocab_size}).")
        if params.max_tokens is None:
            params = params.clone(max_tokens=self.max_model_len - len(prompt_token_ids))
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_id=self.tokenizer.eos_token_id,
            arrival_time=arrival_time,
            priority=priority,
        )
        return prompt_text, request

    def _tokenize(self, prompt: PromptType, add_special_tokens: bool) -> tuple[str | None, list[int]]:
        parsed = parse_singleton_prompt(prompt)
        if parsed.token_ids is not None:
            return parsed.text, parsed.token_ids
        assert parsed.text is not None
        self.check_prompt_bytes(parsed.text)
        return parsed.text, self.tokenizer.encode(parsed.text, add_special_tokens=add_special_tokens)

    def _bad_words_token_ids(self, bad_words: list[str]) -> list[list[int]]:
        """Each bad word's token ids, as vLLM bans them: the word as written (at the start of a text)
        and, if it tokenizes to as many tokens but a different first one, with a leading space (in
        the middle of a text)."""
        sequences: list[list[int]] = []
        for word in bad_words:
            alone = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if not alone:
                raise ValueError(f"bad_words entries must tokenize to at least one token, got {word!r}.")
            sequences.append(alone)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced and spaced[0] != alone[0] and len(spaced) == len(alone):
                sequences.append(spaced)
        if any(t >= self.vocab_size for ids in sequences for t in ids):
            raise ValueError(f"bad_words tokenize to ids outside the model's vocabulary ({self.vocab_size}).")
        return sequences

    def _validate_params_with_vocab(self, params: SamplingParams) -> None:
        """The bounds SamplingParams cannot check alone: they depend on the model's vocabulary."""
        if not (params.top_k == -1 or 1 <= params.top_k <= self.vocab_size):
            raise ValueError(f"top_k must be -1 (disabled) or in [1, {self.vocab_size}], got {params.top_k}.")
        bad = next((t for t in params.stop_token_ids if t >= self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"stop_token_ids must be token ids in [0, {self.vocab_size}), got {bad}.")

    def _validate_prompt(self, prompt_token_ids: list[int]) -> None:
        if not prompt_token_ids:
            raise ValueError("The prompt is empty: it must have at least one token.")
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            raise ValueError(f"Prompt token ids must be in [0, {self.vocab_size}).")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt is {len(prompt_token_ids)} tokens long, which leaves no room to generate "
                f"within max_model_len ({self.max_model_len}); the prompt must be shorter than max_model_len."
            )
