"""Sampler: penalties -> (greedy | temperature -> top-k / top-p / min-p -> sample), plus logprobs.

Logprobs are computed from the raw logits, before any penalty or temperature, so they are the
model's own ``log_softmax`` (vLLM's default, ``raw_logprobs``).
"""

from __future__ import annotations

import torch
from torch import nn

from tracevllm.sample.metadata import SamplingMetadata
from tracevllm.sample.ops.penalties import apply_penalties
from tracevllm.sample.ops.topk_topp_sampler import apply_min_p, apply_top_k_top_p, random_sample
from tracevllm.worker.outputs import LogprobsTensors, SamplerOutput


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        raw_logprobs = logits.log_softmax(dim=-1) if metadata.max_num_logprobs is not None else None
        logits = self.apply_min_tokens(logits, metadata)
        if not metadata.no_penalties:
            logits = apply_penalties(
                logits, metadata.prompt_token_ids, metadata.output_token_ids, metadata.presence_penalties,
                metadata.frequency_penalties, metadata.repetition_penalties,
            )
        sampled = self.sample(logits, metadata)
        logprobs = None
        if raw_logprobs is not None:
            logprobs = self.gather_logprobs(raw_logprobs, metadata.max_num_logprobs, sampled)
        return SamplerOutput(sampled, logprobs)

    @staticmethod
    def apply_min_tokens(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """Rows still short of ``min_tokens`` may not pick EOS or a stop token."""
        if not metadata.min_tokens:
            return logits
        rows, cols = [], []
        for row, (_, banned) in metadata.min_tokens.items():
            rows += [row] * len(banned)
            cols += list(banned)
        if rows:
            logits = logits.clone()
            logits[rows, cols] = float("-inf")
        return logits

    @staticmethod
    def sample(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if metadata.all_greedy:
            return greedy
        temperature = metadata.temperature
        assert temperature is not None
        # Greedy rows get temperature 1 here only to avoid dividing by zero; torch.where drops them.
        logits = logits / torch.where(temperature > 0, temperature, 1.0).unsqueeze(1)
        if metadata.top_k is not None or metadata.top_p is not None:
            logits = apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)
        if metadata.min_p is not None:
            logits = apply_min_p(logits, metadata.min_p)
        random = random_sample(logits.softmax(dim=-1), metadata.generators)
        if metadata.all_random:
            return random
        return torch.where(temperature > 0, random, greedy)

    @staticmethod
    def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, sampled: torch.Tensor) -> LogprobsTensors:
        """Column 0: the sampled token; then the top ``num_logprobs`` tokens. Rank 1 = most likely."""
        sampled_logprobs = logprobs.gather(1, sampled.unsqueeze(1))
        ranks = (logprobs > sampled_logprobs).sum(dim=-1) + 1
        top_values, top_ids = logprobs.topk(num_logprobs, dim=-1) if num_logprobs > 0 else (
            logprobs[:, :0], sampled.new_zeros(len(sampled), 0))
        return LogprobsTensors(
            logprob_token_ids=torch.cat([sampled.unsqueeze(1), top_ids], dim=1),
            logprobs=torch.cat([sampled_logprobs, top_values], dim=1),
            selected_token_ranks=ranks,
        )
