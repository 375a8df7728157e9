"""Processor: a user's prompt and sampling parameters in, validated EngineCoreRequests out.

Shared by both front ends (LLMEngine and AsyncLLM): ``process_request`` tokenizes and validates
(``process_inputs``), and fans a request with ``n > 1`` out into n engine-core requests
``"{i}_{request_id}"`` (seeds ``seed + i``) under one ``ParentRequest``.
"""

from __future__ import annotations

import time

from tracevllm.config import VllmConfig
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.output_processor import ParentRequest
from tracevllm.inputs import PromptType, parse_singleton_prompt
from tracevllm.sampling_params import SamplingParams

__all__ = ["MAX_LOGPROBS", "Processor", "PromptType"]

MAX_LOGPROBS = 20  # the most top logprobs a position may ask for (vLLM's default max_logprobs)


class Processor:
    def __init__(self, vllm_config: VllmConfig, tokenizer) -> None:
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab_size = vllm_config.model_config.vocab_size
        self.tokenizer = tokenizer

    def process_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
        add_special_tokens: bool = True, arrival_time: float | None = None, messages: list[dict] | None = None,
    ) -> tuple[ParentRequest, list[EngineCoreRequest]]:
        """Validate and tokenize without queueing anything (raises ValueError on bad input).

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
        if params.n == 1:
            return parent, [request]
        children = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            child_params = request.sampling_params.clone(n=1, seed=seed)
            children.append(
                EngineCoreRequest(
                    f"{i}_{request_id}", request.prompt_token_ids, child_params, request.eos_token_id,
                    arrival_time, priority,
                )
            )
        return parent, children

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
