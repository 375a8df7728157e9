"""Sampler: one token per row of the logits, plus the logprobs the requests asked for.

The stages, in vLLM V1's order (each is skipped when no row of the batch needs it)::

    raw logits ──> logprobs = log_softmax(raw logits)          (only if some row wants logprobs)
        │
        ├─ min_tokens: EOS and stop tokens -> -inf            (rows still short of min_tokens)
        ├─ bad words: the token completing a banned sequence -> -inf
        ├─ penalties: repetition, frequency, presence
        ├─ greedy rows: argmax ─────────────────────────────┐  (all greedy: done here)
        └─ random rows: / temperature -> min-p -> top-k -> top-p -> softmax -> inverse-CDF draw
                                                            │
                 torch.where(temperature < eps, greedy, random) -> sampled ids [B] int64

A row with no valid distribution to pick from (a NaN logit, an infinite one, or every token at
-inf: a broken model, or logits overflowed by the parameters) is a *failed* row, not a crash: it
gets id 0, which every later stage can index, and ``SamplerOutput.failed`` marks it, so the
scheduler ends that one request with ``FinishReason.ERROR`` and the rest of the batch goes on.
Greedy rows are checked on the maximum their argmax already computes; random rows on the total
their draw already sums (``topk_topp_sampler``): one comparison per row, no host sync.

Logprobs come from the raw logits, before any penalty or temperature, so they are the model's
own ``log_softmax`` (vLLM's default ``raw_logprobs`` mode). Min-p runs before top-k/top-p as in
vLLM (it is argmax-invariant); the set it drops does not depend on that order, but the top-p
nucleus is taken over what min-p left. The input logits are never modified.
"""

from __future__ import annotations

import torch
from torch import nn

from tracevllm.sample.metadata import SamplingMetadata
from tracevllm.sample.ops.bad_words import apply_bad_words
from tracevllm.sample.ops.penalties import apply_all_penalties
from tracevllm.sample.ops.topk_topp_sampler import (
    apply_min_p,
    apply_top_k_top_p,
    RandomDraw,
    sample_from_softmax,
)
from tracevllm.sampling_params import SAMPLING_EPS
from tracevllm.model_runner_output import LogprobsTensors, SamplerOutput


class Sampler(nn.Module):
    def __init__(self, random_draw: RandomDraw = sample_from_softmax) -> None:
        super().__init__()
        # How random rows draw their token; optimisation "two_level_sampling" swaps in its function.
        self.random_draw = random_draw

    def forward(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> SamplerOutput:
        md = sampling_metadata
        logits = logits.float()
        raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs is not None else None
        logits = self.apply_min_tokens(logits, md)
        if md.bad_words_token_ids:
            logits = apply_bad_words(logits, md.bad_words_token_ids, md.output_token_ids)
        if not md.no_penalties:
            assert md.presence_penalties is not None and md.frequency_penalties is not None
            assert md.repetition_penalties is not None
            logits = apply_all_penalties(
                logits, md.prompt_token_ids, md.presence_penalties, md.frequency_penalties,
                md.repetition_penalties, md.output_token_ids,
            )
        sampled, failed = self.sample(logits, md)
        logprobs_tensors = None
        if raw_logprobs is not None:
            assert md.max_num_logprobs is not None
            logprobs_tensors = self.gather_logprobs(raw_logprobs, md.max_num_logprobs, sampled)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs_tensors, failed=failed)

    @staticmethod
    def apply_min_tokens(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Rows still short of ``min_tokens`` may not pick EOS or a stop token.

        Ids outside the vocabulary are skipped: the model can never produce them anyway.
        """
        vocab_size = logits.shape[1]
        rows: list[int] = []
        cols: list[int] = []
        for row, (_, banned) in md.min_tokens.items():
            ids = [t for t in banned if t < vocab_size]
            rows += [row] * len(ids)
            cols += ids
        if not rows:
            return logits
        logits = logits.clone()
        logits[rows, cols] = float("-inf")
        return logits

    def sample(self, logits: torch.Tensor, md: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy rows take the argmax; the others draw from their filtered distribution.

        Returns the ids ``[B]`` and the failed rows ``[B]`` bool (id 0)."""
        greedy = greedy_failed = None
        if not md.all_random:
            # max(dim) is argmax plus the maximum, NaN where the row holds one; a NaN or infinite maximum
            # fails "|top| < inf", in fewer launches than isfinite (docs/perf-log.md#sampler-launch-count).
            top, greedy = logits.max(dim=-1)
            greedy_failed = ~(top.abs() < float("inf"))
            greedy = greedy.masked_fill(greedy_failed, 0)
        if md.all_greedy:
            assert greedy is not None and greedy_failed is not None
            return greedy, greedy_failed
        temperature = md.temperature
        assert temperature is not None, "temperature is None only when all rows are greedy"
        if greedy is None:  # every row random: no row to tell apart
            logits = logits / temperature.unsqueeze(1)
        else:
            is_greedy = temperature < SAMPLING_EPS
            # Greedy rows divide by 1 only to stay finite; their random draw is discarded below.
            logits = logits / torch.where(is_greedy, 1.0, temperature).unsqueeze(1)
        if md.min_p is not None:
            logits = apply_min_p(logits, md.min_p)
        logits = apply_top_k_top_p(logits, md.top_k, md.top_p, md.max_top_k)
        random, valid = self.random_draw(logits, md.generators)
        if greedy is None:
            return random, ~valid
        return torch.where(is_greedy, greedy, random), torch.where(is_greedy, greedy_failed, ~valid)

    @staticmethod
    def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, sampled: torch.Tensor) -> LogprobsTensors:
        """``[B, num_logprobs + 1]``: column 0 the sampled token, then the ``num_logprobs`` most
        likely ones (best first). The sampled token's rank is 1 + the number of tokens with a
        strictly higher logprob, so the argmax has rank 1."""
        sampled = sampled.unsqueeze(1)
        sampled_logprobs = logprobs.gather(1, sampled)
        ranks = (logprobs > sampled_logprobs).sum(dim=-1) + 1
        top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
        return LogprobsTensors(
            logprob_token_ids=torch.cat([sampled, top_ids], dim=1),
            logprobs=torch.cat([sampled_logprobs, top_logprobs], dim=1),
            selected_token_ranks=ranks,
        )
