"""Top-k, top-p and min-p filtering, and drawing one token from what remains."""

from __future__ import annotations

import torch


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) every token outside each row's top ``k`` and outside its top-``p`` nucleus.

    One ascending sort serves both: the k-th largest value is a threshold, and the nucleus is the
    shortest run of largest probabilities whose sum reaches ``p`` (the token that crosses ``p`` is
    kept, so the support is never empty).
    """
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)
    vocab_size = logits.shape[1]
    if k is not None:
        kth = sorted_logits.gather(1, (vocab_size - k.clamp(1, vocab_size)).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if p is not None:
        probs = sorted_logits.softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        # ascending: drop tokens whose cumulative mass (from the smallest) stays within 1 - p
        drop = cum <= 1 - p.unsqueeze(1)
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` times the row's highest probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One token per row by inverse transform sampling: the first token whose cumulative
    probability reaches ``u * total``, with ``u`` uniform in (0, 1].

    Seeded rows draw their ``u`` from their own generator, so their tokens do not depend on which
    other requests share the batch. One uniform number per row (rather than one random number per
    vocabulary entry) keeps the cost at a cumulative sum; no host sync is needed.
    """
    u = torch.rand(probs.shape[0], 1, device=probs.device)
    for row, generator in generators.items():
        u[row] = torch.rand(1, generator=generator, device=probs.device)
    cdf = probs.cumsum(dim=-1)
    # 1 - u is in (0, 1], so a token of probability 0 is never chosen.
    target = (1.0 - u) * cdf[:, -1:]
    return torch.searchsorted(cdf, target).clamp_(max=probs.shape[1] - 1).squeeze(1)
