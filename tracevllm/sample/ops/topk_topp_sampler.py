"""Top-k, top-p and min-p filtering, and drawing one token per row from what remains.

Filters work on logits and mask the tokens they drop with ``-inf``, so the following softmax
renormalises over the survivors. Every filter keeps the row's most likely token, so no row is
ever left empty.

The draws never return an id outside the vocabulary, whatever they are given. A row that is not a
distribution (a NaN anywhere, an infinite weight, or nothing but zeros: what the softmax of NaN,
+inf or all -inf logits gives) draws id 0 and is reported as not valid: its total weight, which the
draw computes anyway, is not finite and positive. Checking costs one comparison per row.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's highest probability.

    Only the ratio to the top probability matters, so the set dropped is the same whether the row
    was renormalised before or not. ``min_p == 0`` keeps everything.
    """
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                      max_k: int = 0) -> torch.Tensor:
    """Keep each row's ``k`` largest logits, then the top-``p`` nucleus of what is left.

    ``k == vocab_size`` and ``p == 1`` switch a row's filter off. Top-k alone needs no sort
    (``apply_top_k_only``, which takes ``max_k``: the largest ``k`` of the rows with the filter on,
    known on the host). Otherwise one ascending sort serves both filters::

        sorted ascending:  [ smallest ............................ largest ]
        top-k:              -inf below the k-th largest value (ties with it stay)
        top-p:              -inf while the cumulative mass from the left is <= 1 - p

    The top-p rule keeps exactly the shortest run of largest probabilities whose sum reaches
    ``p``: a token survives iff the tokens more likely than it hold less than ``p`` in total.
    The largest token always survives. Top-p sees the distribution renormalised after top-k.
    """
    if p is None:
        return logits if k is None else apply_top_k_only(logits, k, max_k)
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)
    vocab_size = logits.shape[1]
    if k is not None:
        kth_largest = sorted_logits.gather(1, (vocab_size - k.clamp(1, vocab_size)).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, float("-inf"))
    cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum_probs <= 1 - p.unsqueeze(1)
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor, max_k: int) -> torch.Tensor:
    """Top-k without sorting the vocabulary: ``topk(max_k)`` gives each row's k-th largest value.

    Rows with the filter off (``k == vocab_size``) are set aside so that they do not force a
    full-vocabulary ``topk``. ``max_k``, the largest ``k`` of the other rows (1 if none), comes from
    the host (``SamplingMetadata.max_top_k``): reading it off ``k`` would wait for the device.
    """
    assert max_k >= 1, "max_k: the largest k of the rows with top-k on"
    vocab_size = logits.shape[1]
    off = k >= vocab_size
    k = k.masked_fill(off, 1).clamp(min=1)
    kth_largest = logits.topk(max_k, dim=-1).values.gather(1, (k - 1).unsqueeze(1))
    kth_largest = kth_largest.masked_fill(off.unsqueeze(1), float("-inf"))
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def random_sample(
    probs: torch.Tensor, generators: dict[int, torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row by inverse transform sampling: the first token whose cumulative
    probability reaches ``u * total``, with ``u`` uniform in (0, 1]. Returns the ids ``[B]`` and
    which rows were valid distributions ``[B]`` bool (the others get id 0).

    A token of probability 0 adds nothing to the cumulative sum, so the search always lands on an
    earlier token first: it is never picked. Seeded rows draw their ``u`` from their own generator,
    so their token depends only on their own logits and seed, never on which requests share the
    batch. One random number per row (vLLM's exponential race draws one per vocabulary entry) keeps
    the cost at a cumulative sum (docs/perf-log.md#inverse-cdf-sampling). No host
    sync; the loop is over the seeded rows only.
    """
    u = _uniform(probs, generators)
    cdf = probs.cumsum(dim=-1)
    target = (1.0 - u) * cdf[:, -1:]  # 1 - u is in (0, 1]: the target is never 0
    ids = torch.searchsorted(cdf, target).clamp_(max=probs.shape[1] - 1).squeeze(1)
    return _drop_invalid(ids, cdf[:, -1])


def _drop_invalid(ids: torch.Tensor, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose total weight is NaN, infinite or not positive were no distribution: id 0.

    Two comparisons, which a NaN total fails both: fewer launches than ``isfinite``
    (docs/perf-log.md#sampler-launch-count)."""
    valid = (total > 0) & (total < float("inf"))
    return torch.where(valid, ids, 0), valid


def _uniform(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """``[B, 1]`` uniform in [0, 1); seeded rows from their own generator."""
    u = torch.rand(probs.shape[0], 1, device=probs.device)
    for row, generator in generators.items():
        u[row] = torch.rand(1, generator=generator, device=probs.device)
    return u


def random_sample_two_level(weights: torch.Tensor, generators: dict[int, torch.Generator],
                            block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``random_sample``'s draw in two levels (optimisation "two_level_sampling"), on unnormalised
    ``weights`` (e.g. ``exp(logits - max)``: no softmax division needed, the target scales with the total).

    The vocabulary is cut into blocks of ``block`` tokens. The cumulative sum runs over the block
    totals (V / 256 values per row) to find the block where ``u * total`` falls, then over that one
    block; the full-vocabulary cumulative sum (a sequential pass over every logit) is never built.
    Same rule, same ``u`` as ``random_sample``; the sums are added in another order, so a draw that
    falls within rounding of a token boundary may land on its neighbour. A token of weight 0 is never
    picked: the target is above the previous blocks' sum, and at most the block's own sum. Its gain:
    docs/perf-log.md#switchable-speed-ups.
    Returns what ``random_sample`` returns."""
    u = _uniform(weights, generators)
    rows, vocab = weights.shape
    if vocab % block:
        weights = F.pad(weights, (0, -vocab % block))  # the padding weighs 0
    blocks = weights.view(rows, -1, block)
    block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)  # [B, V / block]
    target = (1.0 - u) * block_cdf[:, -1:]
    b = torch.searchsorted(block_cdf, target).clamp_(max=block_cdf.shape[1] - 1)  # [B, 1]: the block
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), 0.0)
    inner = blocks.gather(1, b.unsqueeze(-1).expand(-1, 1, block)).squeeze(1).cumsum(dim=-1) + before
    # The first token reaching the target; the target is capped at the block's own last sum, which
    # the block's last token of non-zero weight reaches first.
    i = torch.searchsorted(inner, torch.minimum(target, inner[:, -1:]))
    # A NaN target finds no token (i == block): the clamp keeps even that inside the vocabulary.
    ids = (b * block + i).clamp_(max=vocab - 1).squeeze(1)
    return _drop_invalid(ids, block_cdf[:, -1])


# A draw from the step's final logits, ``(logits, generators) -> (ids, valid)``: what ``Sampler`` is
# given. The plain one is the softmax and ``random_sample``; optimisation "two_level_sampling" swaps in
# the function of that name.
RandomDraw = Callable[[torch.Tensor, dict[int, torch.Generator]], tuple[torch.Tensor, torch.Tensor]]


def sample_from_softmax(logits: torch.Tensor,
                        generators: dict[int, torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain draw: ``random_sample`` on the logits' softmax."""
    return random_sample(logits.softmax(dim=-1), generators)


def two_level_sampling(logits: torch.Tensor,
                       generators: dict[int, torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimisation "two_level_sampling": ``random_sample_two_level`` on ``exp(logits - max)``, so the
    softmax's division is never done."""
    return random_sample_two_level((logits - logits.amax(dim=-1, keepdim=True)).exp_(), generators)
