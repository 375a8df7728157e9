"""SamplingMetadata: the batch's sampling parameters as tensors, one row per sampling request."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class SamplingMetadata:
    """Built by the model runner from its persistent batch each step, rows in logits order.

    Optional tensors are None when no row needs them, so the sampler skips that stage entirely.
    """

    # [B] float32; rows below sampling_params.SAMPLING_EPS are greedy (SamplingParams.greedy). None: all greedy
    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # [B] float32, 1.0 = off
    top_k: torch.Tensor | None  # [B] int64, vocab_size = off
    # The largest k of the rows whose top-k is on (1 if none), read on the host from the batch's own
    # array, so that top-k sizes its ``topk`` without waiting for the device. 0 when top_k is None.
    max_top_k: int
    min_p: torch.Tensor | None  # [B] float32, 0.0 = off
    # row -> generator, for requests with a seed; other rows use the global RNG.
    generators: dict[int, torch.Generator]
    # Largest ``logprobs`` asked for by any row; None when no row asked.
    max_num_logprobs: int | None
    no_penalties: bool
    presence_penalties: torch.Tensor | None  # [B] float32
    frequency_penalties: torch.Tensor | None  # [B] float32
    repetition_penalties: torch.Tensor | None  # [B] float32
    # [B, max_prompt_len] int64, padded with vocab_size; only needed for the repetition penalty.
    prompt_token_ids: torch.Tensor | None
    # per row, the tokens generated so far (empty when neither penalties nor bad words need them)
    output_token_ids: list[list[int]]
    # row -> (min_tokens, token ids banned until then: EOS and stop_token_ids), for rows whose
    # output is still shorter than min_tokens.
    min_tokens: dict[int, tuple[int, set[int]]]
    # row -> the token sequences that row may not generate (SamplingParams.bad_words_token_ids)
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)
