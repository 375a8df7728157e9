"""Repetition, frequency and presence penalties, vectorised over the batch."""

from __future__ import annotations

import torch


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, L]`` ids padded with ``vocab_size`` -> ``[B, vocab_size]`` occurrence counts."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.int64, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def pad_token_lists(lists: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max((len(x) for x in lists), default=0)
    out = torch.full((len(lists), max(width, 1)), pad, dtype=torch.int64)
    for i, ids in enumerate(lists):
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out.to(device)


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor | None,
    output_token_ids: list[list[int]],
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Penalise tokens already seen, as vLLM and OpenAI define it.

    Repetition (Hugging Face's rule, over prompt and output): a seen token's logit is divided by the
    penalty if positive, multiplied if negative. Frequency and presence (output only):
    ``logit -= frequency * count + presence * (count > 0)``.
    """
    vocab_size = logits.shape[1]
    output_counts = token_counts(pad_token_lists(output_token_ids, vocab_size, logits.device), vocab_size)
    seen = output_counts > 0
    if prompt_token_ids is not None:
        seen = seen | (token_counts(prompt_token_ids, vocab_size) > 0)
    rep = repetition_penalties.unsqueeze(1).expand_as(logits)
    scaled = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen & (rep != 1.0), scaled, logits)
    logits = logits - frequency_penalties.unsqueeze(1) * output_counts
    return logits - presence_penalties.unsqueeze(1) * (output_counts > 0)
