"""Repetition, frequency and presence penalties, vectorised over the batch.

Both token-id tensors here are ``[B, L]`` int64, right-padded with ``vocab_size``: an id no real
token has, so counting into ``vocab_size + 1`` bins and dropping the last bin ignores the padding
without a mask.
"""

from __future__ import annotations

import torch


def get_token_bin_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, L]`` padded ids -> ``[B, vocab_size]`` int64 count of each id in its row."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.int64, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def make_output_token_tensor(
    output_token_ids: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """Per-row lists of generated ids -> ``[B, max_len]`` (at least one column) padded with
    ``vocab_size``. Built on the host, then copied once."""
    width = max(1, max((len(ids) for ids in output_token_ids), default=0))
    out = torch.full((len(output_token_ids), width), vocab_size, dtype=torch.int64)
    for row, ids in enumerate(output_token_ids):
        if ids:
            out[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out.to(device)


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor | None,
    output_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """Penalise tokens already seen, as vLLM (and OpenAI for frequency and presence) define it.

    * repetition, ``r`` (Hugging Face's rule), for every token seen in the prompt or the output:
      a positive logit is divided by ``r``, a negative one multiplied by it (so ``r > 1`` always
      lowers the token). ``prompt_token_ids`` None means no row has ``r != 1``: then only the
      output is looked at, which is a no-op for ``r == 1``.
    * frequency ``f`` and presence ``p``, over the output only:
      ``logit -= f * count + p * (count > 0)``.

    Returns a new tensor; ``logits`` is left as it was.
    """
    vocab_size = logits.shape[1]
    output_counts = get_token_bin_counts(output_token_ids, vocab_size)
    output_mask = output_counts > 0
    seen = output_mask
    if prompt_token_ids is not None:
        seen = seen | (get_token_bin_counts(prompt_token_ids, vocab_size) > 0)
    rep = torch.where(seen, repetition_penalties.unsqueeze(1), 1.0)
    logits = torch.where(logits > 0, logits / rep, logits * rep)
    logits = logits - frequency_penalties.unsqueeze(1) * output_counts
    return logits - presence_penalties.unsqueeze(1) * output_mask


def apply_all_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor | None,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
    output_token_ids: list[list[int]],
) -> torch.Tensor:
    """``apply_penalties`` with the generated tokens given as the runner keeps them (lists)."""
    assert len(output_token_ids) == logits.shape[0], "one list of output tokens per logits row"
    output = make_output_token_tensor(output_token_ids, logits.shape[1], logits.device)
    return apply_penalties(
        logits, prompt_token_ids, output, presence_penalties, frequency_penalties, repetition_penalties
    )
