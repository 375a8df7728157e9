"""The Sampler end to end, against independent references: argmax, supports computed by sorting
the probabilities in the test, the renormalised softmax, and torch.log_softmax.

Statistical tests draw many rows in one call under a fixed global seed, so they are deterministic;
tolerances are set at 6 binomial standard deviations, so a correct sampler cannot fail them under
any seed, while a wrong distribution (a dropped token, a wrong temperature) misses by far more.
"""

from __future__ import annotations

import pytest
import torch

from tracevllm.sample.metadata import SamplingMetadata
from tracevllm.sample.ops.topk_topp_sampler import sample_from_softmax, two_level_sampling
from tracevllm.sample.sampler import Sampler

V = 16


def metadata(batch, temperature=1.0, top_k=None, top_p=None, min_p=None, generators=None, logprobs=None,
             min_tokens=None, penalties=None, output_ids=None, prompt_ids=None) -> SamplingMetadata:
    if not isinstance(temperature, torch.Tensor):
        temperature = torch.full((batch,), float(temperature))
    full = lambda x, dtype=torch.float32: None if x is None else torch.full((batch,), x, dtype=dtype)  # noqa: E731
    pres, freq, rep = penalties if penalties is not None else (None, None, None)
    return SamplingMetadata(
        temperature=temperature, all_greedy=bool((temperature == 0).all()),
        all_random=bool((temperature > 0).all()), top_p=full(top_p), top_k=full(top_k, torch.int64),
        max_top_k=0 if top_k is None else top_k if 1 <= top_k < V else 1,
        min_p=full(min_p), generators=generators or {}, max_num_logprobs=logprobs,
        no_penalties=penalties is None, presence_penalties=pres, frequency_penalties=freq,
        repetition_penalties=rep, prompt_token_ids=prompt_ids, output_token_ids=output_ids or [],
        min_tokens=min_tokens or {},
    )


LOGITS = torch.randn(V, generator=torch.Generator().manual_seed(0)) * 2  # one fixed distribution


def draw(n: int, **md) -> torch.Tensor:
    """``n`` independent draws from LOGITS (one batch of ``n`` identical rows), fixed global seed."""
    torch.manual_seed(0)
    return Sampler()(LOGITS.repeat(n, 1), metadata(n, **md)).sampled_token_ids


def support(samples: torch.Tensor) -> set[int]:
    return set(samples.tolist())


def frequencies(samples: torch.Tensor) -> torch.Tensor:
    return torch.bincount(samples, minlength=V).double() / len(samples)


def assert_follows(samples: torch.Tensor, probs: torch.Tensor) -> None:
    probs = probs.double()
    tol = 6 * (probs * (1 - probs) / len(samples)).sqrt()
    assert ((frequencies(samples) - probs).abs() <= tol).all(), (frequencies(samples), probs)


def descending() -> tuple[list[int], list[float]]:
    probs = LOGITS.double().softmax(-1)
    order = sorted(range(V), key=lambda i: -probs[i].item())
    return order, [probs[i].item() for i in order]


def test_output_shape_and_dtype():
    out = Sampler()(torch.randn(3, V), metadata(3))
    assert out.sampled_token_ids.shape == (3,) and out.sampled_token_ids.dtype == torch.int64
    assert out.logprobs_tensors is None


def test_greedy_is_argmax():
    logits = torch.randn(6, V)
    assert torch.equal(Sampler()(logits, metadata(6, temperature=0.0)).sampled_token_ids, logits.argmax(-1))
    mixed = torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0, 1e-7])  # below 1e-5 counts as greedy
    out = Sampler()(logits, metadata(6, temperature=mixed, top_k=3)).sampled_token_ids
    greedy = mixed < 1e-5
    assert torch.equal(out[greedy], logits.argmax(-1)[greedy])


def test_input_logits_are_not_modified():
    logits = torch.randn(2, V)
    before = logits.clone()
    md = metadata(2, top_k=3, top_p=0.5, min_p=0.1, min_tokens={0: (5, {1})},
                  penalties=(torch.ones(2), torch.ones(2), torch.full((2,), 2.0)), output_ids=[[1, 2], [3]])
    Sampler()(logits, md)
    assert torch.equal(logits, before)


def test_global_seed_reproducible():
    assert torch.equal(draw(500), draw(500))
    torch.manual_seed(1)
    other = Sampler()(LOGITS.repeat(500, 1), metadata(500)).sampled_token_ids
    assert not torch.equal(draw(500), other)


def test_seeded_row_independent_of_batch_and_global_seed():
    logits = torch.randn(4, V)

    def run(seed: int, rows: list[int], at: int, global_seed: int) -> list[int]:
        torch.manual_seed(global_seed)
        g = torch.Generator().manual_seed(seed)
        sampler = Sampler()
        md = metadata(len(rows), generators={at: g})
        return [sampler(logits[rows], md).sampled_token_ids[at].item() for _ in range(20)]

    alone = run(42, [2], 0, global_seed=0)
    assert run(42, [0, 1, 2, 3], 2, global_seed=1) == alone
    assert run(42, [2, 3], 0, global_seed=2) == alone
    assert run(7, [2], 0, global_seed=0) != alone
    assert len(set(alone)) > 1, "a generator advances from step to step"


def test_frequencies_follow_the_distribution():
    assert_follows(draw(20000), LOGITS.softmax(-1))


@pytest.mark.parametrize("t", [0.5, 2.0])
def test_temperature(t):
    samples = draw(20000, temperature=t)
    assert_follows(samples, (LOGITS / t).softmax(-1))
    top = LOGITS.argmax().item()
    base = frequencies(draw(20000))[top]
    assert frequencies(samples)[top] > base if t < 1 else frequencies(samples)[top] < base


def test_top_k_support_is_the_k_largest():
    k = 4
    samples = draw(4000, top_k=k)
    order, _ = descending()
    assert support(samples) == set(order[:k])  # nothing outside, and each of the k appears
    probs = torch.zeros(V).index_fill(0, torch.tensor(order[:k]), 1.0) * LOGITS.softmax(-1)
    assert_follows(samples, probs / probs.sum())


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_top_p_support_is_the_smallest_prefix_reaching_p(p):
    order, probs = descending()
    cum = [sum(probs[: i + 1]) for i in range(V)]
    n_keep = next(i + 1 for i, c in enumerate(cum) if c >= p)
    assert all(abs(c - p) > 1e-3 for c in cum), "p must not sit on a boundary"
    assert support(draw(6000, top_p=p)) == set(order[:n_keep])


def test_min_p_support():
    probs = LOGITS.softmax(-1)
    expected = set(torch.nonzero(probs >= 0.1 * probs.max()).flatten().tolist())
    assert 1 < len(expected) < V
    assert support(draw(6000, min_p=0.1)) == expected


def test_min_p_then_top_p_as_in_vllm():
    """vLLM applies min-p first; top-p then takes its nucleus of the renormalised remainder.
    (With min-p applied after top-p, as Hugging Face does, these values would keep one more token.)"""
    order, probs = descending()
    kept = [q for q in probs if q >= 0.2 * probs[0]]
    cum = [sum(kept[: i + 1]) / sum(kept) for i in range(len(kept))]
    assert all(abs(c - 0.6) > 1e-3 for c in cum), "p must not sit on a boundary"
    n_keep = next(i + 1 for i, c in enumerate(cum) if c >= 0.6)
    assert support(draw(6000, min_p=0.2, top_p=0.6)) == set(order[:n_keep])


def test_penalties_change_the_greedy_choice():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]])
    prompt = torch.tensor([[3, 4], [4, 4]])  # 4 = padding (vocab size)
    pres, freq, rep = torch.tensor([0.0, 0.5]), torch.tensor([0.0, 2.0]), torch.tensor([2.0, 1.0])
    md = metadata(2, temperature=0.0, penalties=(pres, freq, rep), output_ids=[[], [3]], prompt_ids=prompt)
    # By hand. Row 0: token 3 is in the prompt, 3 / 2 = 1.5 < 2. Row 1: 3 - 2 * 1 - 0.5 = 0.5 < 2.
    assert logits.argmax(-1).tolist() == [3, 3]
    assert Sampler()(logits, md).sampled_token_ids.tolist() == [0, 0]


def test_min_tokens_bans_eos_and_stop_tokens():
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0], [0.0, 5.0, 4.0, 1.0]])
    # Row 0 is still short of min_tokens (EOS 1, stop token 2; 99 is outside the vocabulary).
    md = metadata(2, temperature=0.0, min_tokens={0: (3, {1, 2, 99})})
    assert Sampler()(logits, md).sampled_token_ids.tolist() == [3, 1]
    torch.manual_seed(0)
    md = metadata(2000, min_tokens={i: (3, {1}) for i in range(2000)})
    assert 1 not in Sampler()(logits[:1].repeat(2000, 1), md).sampled_token_ids.tolist()


def test_logprobs_are_log_softmax_of_raw_logits_with_ranks():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(3))
    temps = torch.tensor([0.0, 0.5, 1.0, 2.0])
    # Penalties, min_tokens and top-k change what is sampled, never the logprobs returned.
    md = metadata(4, temperature=temps, logprobs=3, top_k=5, min_tokens={0: (2, {int(logits[0].argmax())})},
                  penalties=(torch.ones(4), torch.ones(4), torch.full((4,), 1.5)), output_ids=[[1], [2], [], [3]])
    torch.manual_seed(0)
    out = Sampler()(logits, md)
    ref = torch.log_softmax(logits, dim=-1)
    lp, sampled = out.logprobs_tensors, out.sampled_token_ids
    assert lp.logprob_token_ids.shape == lp.logprobs.shape == (4, 4)
    assert torch.equal(lp.logprob_token_ids[:, 0], sampled)
    assert torch.allclose(lp.logprobs[:, 0], ref[torch.arange(4), sampled])
    top = ref.topk(3, dim=-1)
    assert torch.equal(lp.logprob_token_ids[:, 1:], top.indices)
    assert torch.allclose(lp.logprobs[:, 1:], top.values)
    for i, s in enumerate(sampled.tolist()):
        assert lp.selected_token_ranks[i].item() == 1 + sorted(ref[i].tolist(), reverse=True).index(ref[i, s].item())
    assert lp.selected_token_ranks[0].item() == 2, "row 0 cannot pick its argmax (min_tokens)"


def test_zero_logprobs_is_the_sampled_token_only():
    logits = torch.randn(3, V)
    lp = Sampler()(logits, metadata(3, temperature=0.0, logprobs=0)).logprobs_tensors
    assert lp.logprobs.shape == lp.logprob_token_ids.shape == (3, 1)
    assert torch.equal(lp.logprob_token_ids[:, 0], logits.argmax(-1))
    assert torch.equal(lp.selected_token_ranks, torch.ones(3, dtype=torch.int64))


def broken_logits() -> torch.Tensor:
    """Rows 0 and 5 fine; 1 has a NaN, 2 is all -inf, 3 has +inf, 4 a NaN where the argmax is."""
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(3))
    logits[1, 5] = float("nan")
    logits[2] = float("-inf")
    logits[3, 7] = float("inf")
    logits[4, logits[4].argmax()] = float("nan")
    return logits


@pytest.mark.parametrize("random_draw", [sample_from_softmax, two_level_sampling], ids=["plain", "two_level"])
@pytest.mark.parametrize("temperature", [
    0.0, 1.0, torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
], ids=["greedy", "random", "mixed", "mixed2"])
@pytest.mark.parametrize("filters", [{}, dict(top_k=5, top_p=0.9, min_p=0.05)], ids=["plain", "filtered"])
def test_rows_without_a_valid_distribution_fail_with_an_in_vocab_id(random_draw, temperature, filters):
    """Issue 27: NaN / +inf / all -inf logits made the sampler return id V, and the next step's
    embedding lookup raised IndexError. Such rows now fail alone: id 0, marked in ``failed``."""
    logits = broken_logits()
    out = Sampler(random_draw)(logits, metadata(6, temperature=temperature, logprobs=2, **filters))
    assert out.failed.tolist() == [False, True, True, True, True, False]
    ids = out.sampled_token_ids
    assert ids[1:5].tolist() == [0, 0, 0, 0] and ((ids >= 0) & (ids < V)).all()
    assert out.logprobs_tensors.logprob_token_ids.shape == (6, 3)


def test_a_temperature_that_overflows_float32_fails_the_row():
    """Finite logits divided by a tiny temperature can still overflow to inf: the draw sees NaN."""
    logits = torch.tensor([[1e35, 0.0, -1e35], [1.0, 2.0, 3.0]])
    out = Sampler()(logits, metadata(2, temperature=torch.tensor([1e-4, 1.0])))
    assert out.failed.tolist() == [True, False] and out.sampled_token_ids[0] == 0


def test_the_runner_draws_through_two_levels_on_a_cpu_only():
    """Optimisation two_level_sampling is the CPU's; on CUDA its 29 operations are kernel launches,
    more than the plain draw's 13, so the plain draw runs there (benchmarks/sampler_draws.py)."""
    from tracevllm.optimizations import OptimizationConfig
    from tracevllm.worker.gpu_model_runner import random_draw

    on, off = OptimizationConfig(), OptimizationConfig.from_names(["two_level_sampling"])
    assert random_draw(torch.device("cpu"), on) is two_level_sampling
    assert random_draw(torch.device("cpu"), off) is sample_from_softmax
    assert random_draw(torch.device("cuda"), on) is sample_from_softmax
