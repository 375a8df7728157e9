"""Top-k / top-p / min-p masks and the inverse-CDF draw, against references written with plain
Python sorting in float64 (no torch sort, no cumsum of the code under test)."""

from __future__ import annotations

import pytest
import torch

from tracevllm.sample.ops.topk_topp_sampler import (
    apply_min_p,
    apply_top_k_top_p,
    random_sample,
    random_sample_two_level,
)

# Both draws, ids only: the plain one, and the two-level one with a block of 4 so that V spans
# several blocks. CHECKED_DRAWS also return which rows were valid distributions.
CHECKED_DRAWS = {"plain": random_sample,
                 "two_level": lambda probs, gens: random_sample_two_level(probs, gens, block=4)}
DRAWS = {name: (lambda probs, gens, f=f: f(probs, gens)[0]) for name, f in CHECKED_DRAWS.items()}

V = 32


def rand_logits(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, V, generator=torch.Generator().manual_seed(seed)) * 2


def kept(masked: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in masked]


def ref_top_k(row: list[float], k: int) -> set[int]:
    order = sorted(range(len(row)), key=lambda i: -row[i])
    return set(order[:k])


def ref_probs(row: list[float], support: set[int]) -> dict[int, float]:
    import math

    top = max(row[i] for i in support)
    w = {i: math.exp(row[i] - top) for i in support}
    total = sum(w.values())
    return {i: x / total for i, x in w.items()}


def ref_top_p(probs: dict[int, float], p: float) -> set[int]:
    """Smallest set of most likely tokens whose mass reaches ``p``."""
    out, cum = set(), 0.0
    for i in sorted(probs, key=lambda i: -probs[i]):
        out.add(i)
        cum += probs[i]
        # The test must not sit on a float boundary, where float32 and float64 may disagree.
        assert abs(cum - p) > 1e-4, "choose another p: a cumulative sum lies on it"
        if cum >= p:
            break
    return out


@pytest.mark.parametrize("with_p", [False, True], ids=["top_k_only", "sort_path"])
def test_top_k_keeps_exactly_the_k_largest(with_p):
    logits = rand_logits(5)
    k = torch.tensor([1, 3, 7, V, V + 10])  # V and above: filter off
    p = torch.ones(5) if with_p else None
    out = apply_top_k_top_p(logits, k, p, max_k=7)
    for row, kk, got in zip(logits.tolist(), k.tolist(), kept(out)):
        assert got == ref_top_k(row, min(kk, V))
    finite = out > float("-inf")
    assert torch.equal(out[finite], logits[finite]), "kept logits are unchanged"


@pytest.mark.parametrize("p", [0.05, 0.3, 0.55, 0.9, 0.99])
def test_top_p_keeps_the_smallest_prefix_reaching_p(p):
    logits = rand_logits(4, seed=1)
    out = apply_top_k_top_p(logits, None, torch.full((4,), p))
    for row, got in zip(logits.tolist(), kept(out)):
        assert got == ref_top_p(ref_probs(row, set(range(V))), p)


def test_top_p_is_taken_after_top_k():
    logits = rand_logits(3, seed=2)
    k, p = torch.tensor([4, 10, V]), torch.tensor([0.7, 0.6, 0.8])
    out = apply_top_k_top_p(logits, k, p)
    for row, kk, pp, got in zip(logits.tolist(), k.tolist(), p.tolist(), kept(out)):
        assert got == ref_top_p(ref_probs(row, ref_top_k(row, kk)), pp)


def test_filters_never_empty_a_row():
    logits = rand_logits(3, seed=3)
    argmax = [{i} for i in logits.argmax(-1).tolist()]
    assert kept(apply_top_k_top_p(logits, None, torch.full((3,), 1e-6))) == argmax
    assert kept(apply_top_k_top_p(logits, torch.ones(3, dtype=torch.int64), None, max_k=1)) == argmax
    assert kept(apply_min_p(logits, torch.ones(3))) == argmax


def test_rows_with_filters_off_are_untouched():
    logits = rand_logits(2, seed=4)
    out = apply_top_k_top_p(logits, torch.tensor([V, 2]), torch.tensor([1.0, 1.0]))
    assert torch.equal(out[0], logits[0])
    assert torch.equal(apply_min_p(logits, torch.zeros(2)), logits)


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.6])
def test_min_p_is_relative_to_the_top_probability(min_p):
    logits = rand_logits(4, seed=5)
    out = apply_min_p(logits, torch.full((4,), min_p))
    for row, got in zip(logits.tolist(), kept(out)):
        probs = ref_probs(row, set(range(V)))
        top = max(probs.values())
        assert got == {i for i, q in probs.items() if q >= min_p * top}


@pytest.mark.parametrize("draw", DRAWS)
def test_random_sample_never_picks_a_zero_probability_token(draw):
    torch.manual_seed(0)
    probs = torch.zeros(2000, V)
    probs[:, [3, 17]] = torch.tensor([1e-6, 1.0 - 1e-6])
    assert set(DRAWS[draw](probs, {}).tolist()) <= {3, 17}
    # Unnormalised weights with zeros at the ends of blocks and of the vocabulary.
    weights = torch.zeros(2000, V)
    weights[:, [5, 8]] = torch.tensor([3.0, 0.5])
    assert set(DRAWS[draw](weights, {}).tolist()) <= {5, 8}


@pytest.mark.parametrize("draw", DRAWS)
def test_random_sample_frequencies(draw):
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0, 0.0, 0.0])
    n = 40000
    counts = torch.bincount(DRAWS[draw](probs.repeat(n, 1) * 7.0, {}), minlength=7).double()  # unnormalised
    # Each count is Binomial(n, p): 6 standard deviations, sqrt(p (1 - p) / n) <= 0.0025, is far
    # beyond any fluctuation a fixed seed could land on, and far below the gaps between the p's.
    tol = 6 * (probs * (1 - probs) / n).sqrt().double() + 1e-12
    assert ((counts / n - probs.double()).abs() <= tol).all()


@pytest.mark.parametrize("sample", DRAWS)
def test_seeded_rows_use_their_own_generator(sample):
    probs = torch.softmax(rand_logits(4, seed=6), dim=-1)

    def draw(rows, seed_row, seed, global_seed):
        torch.manual_seed(global_seed)
        return DRAWS[sample](probs[rows], {seed_row: torch.Generator().manual_seed(seed)})

    ref = [draw([2], 0, s, 0).item() for s in range(50)]
    # Same seed, other rows around it, another global seed: same token each time.
    assert [draw([0, 1, 2, 3], 2, s, 1)[2].item() for s in range(50)] == ref
    assert [draw([3, 2], 1, s, 2)[1].item() for s in range(50)] == ref
    assert len(set(ref)) > 1, "different seeds give different tokens"


@pytest.mark.parametrize("vocab", [V, V - 3])  # V - 3: the two-level draw pads its last block
@pytest.mark.parametrize("draw", CHECKED_DRAWS)
def test_rows_that_are_not_distributions_draw_id_0_and_are_reported(draw, vocab):
    """What the softmax of NaN, +inf or all -inf logits gives (NaN rows), zeros and infinite weights:
    never an id outside the vocabulary (the two-level draw used to return ``vocab``), and flagged."""
    nan, inf = float("nan"), float("inf")
    logits = rand_logits(6)[:, :vocab]
    logits[1, 5] = nan
    logits[2] = -inf
    logits[3, 7] = inf
    probs = logits.softmax(dim=-1)
    probs[4] = 0.0  # unnormalised weights that sum to nothing
    probs[5, 0] = inf
    torch.manual_seed(0)
    ids, valid = CHECKED_DRAWS[draw](probs, {1: torch.Generator().manual_seed(1)})
    assert valid.tolist() == [True, False, False, False, False, False]
    assert ids[1:].tolist() == [0] * 5 and 0 <= ids[0] < vocab
