"""The Sampler against independent references: argmax, sorted-probability supports, log_softmax."""

from __future__ import annotations

import pytest
import torch

from tracevllm.sample.metadata import SamplingMetadata
from tracevllm.sample.sampler import Sampler

V = 20


def metadata(batch: int, temperature=1.0, top_k=None, top_p=None, min_p=None, generators=None,
             logprobs=None, min_tokens=None, penalties=None, output_ids=None, prompt_ids=None) -> SamplingMetadata:
    temp = torch.full((batch,), float(temperature)) if not isinstance(temperature, torch.Tensor) else temperature
    pres, freq, rep = penalties or (None, None, None)
    return SamplingMetadata(
        temperature=temp, all_greedy=bool((temp == 0).all()), all_random=bool((temp > 0).all()),
        top_p=top_p, top_k=top_k, min_p=min_p, generators=generators or {}, max_num_logprobs=logprobs,
        no_penalties=penalties is None, presence_penalties=pres, frequency_penalties=freq,
        repetition_penalties=rep, prompt_token_ids=prompt_ids, output_token_ids=output_ids or [],
        min_tokens=min_tokens or {},
    )


def fixed_logits(batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(V, generator=g) * 2).repeat(batch, 1)


def sample_many(logits, md_kwargs, n=4000) -> torch.Tensor:
    torch.manual_seed(0)
    sampler = Sampler()
    rows = logits.repeat(n, 1)
    return sampler(rows, metadata(n, **md_kwargs(n))).sampled_token_ids


def test_greedy_is_argmax():
    logits = torch.randn(5, V)
    out = Sampler()(logits, metadata(5, temperature=0.0))
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    mixed = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0])
    out = Sampler()(logits, metadata(5, temperature=mixed))
    assert torch.equal(out.sampled_token_ids[mixed == 0], logits.argmax(-1)[mixed == 0])


def test_top_k_support():
    logits = fixed_logits()
    k = 4
    samples = sample_many(logits, lambda n: dict(top_k=torch.full((n,), k)))
    expected = set(logits[0].topk(k).indices.tolist())
    assert set(samples.tolist()) == expected


def test_top_p_support():
    logits = fixed_logits()
    p = 0.7
    probs = logits[0].softmax(-1)
    order = probs.argsort(descending=True)
    cum = probs[order].cumsum(0)
    n_keep = int((cum < p).sum()) + 1  # smallest prefix whose mass reaches p
    expected = set(order[:n_keep].tolist())
    samples = sample_many(logits, lambda n: dict(top_p=torch.full((n,), p)))
    assert set(samples.tolist()) == expected


def test_min_p_support():
    logits = fixed_logits()
    probs = logits[0].softmax(-1)
    expected = set(torch.nonzero(probs >= 0.1 * probs.max()).flatten().tolist())
    samples = sample_many(logits, lambda n: dict(min_p=torch.full((n,), 0.1)))
    assert set(samples.tolist()) == expected


def test_frequencies_follow_the_distribution():
    logits = fixed_logits()
    probs = (logits[0] / 0.8).softmax(-1)
    samples = sample_many(logits, lambda n: dict(temperature=0.8), n=20000)
    freq = torch.bincount(samples, minlength=V).float() / len(samples)
    # 20000 draws: the standard error of each frequency is <= 0.0036; allow 5 of them.
    assert torch.allclose(freq, probs, atol=0.018)


def test_seeded_rows_reproducible_and_independent_of_batch():
    logits = torch.randn(3, V)

    def run(seed, batch_logits):
        g = torch.Generator().manual_seed(seed)
        return Sampler()(batch_logits, metadata(len(batch_logits), generators={0: g})).sampled_token_ids[0]

    torch.manual_seed(1)
    firsts = [run(42, logits).item() for _ in range(5)]
    alone = [run(42, logits[:1]).item() for _ in range(5)]
    assert len(set(firsts)) == 1 and firsts == alone
    seeds = {run(s, logits[:1]).item() for s in range(40)}
    assert len(seeds) > 1


def test_penalties_against_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    out_ids, prompt = [[0, 0, 2]], torch.tensor([[3, 4]])  # 4 = padding (vocab size)
    pres, freq, rep = torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0])
    md = metadata(1, temperature=0.0, penalties=(pres, freq, rep), output_ids=out_ids, prompt_ids=prompt)
    expected = torch.tensor([[2.0 / 2 - 0.25 * 2 - 0.5, -1.0, 0.5 / 2 - 0.25 - 0.5, 3.0 / 2]])
    from tracevllm.sample.ops.penalties import apply_penalties

    got = apply_penalties(logits, md.prompt_token_ids, out_ids, pres, freq, rep)
    assert torch.allclose(got, expected)
    assert Sampler()(logits, md).sampled_token_ids.item() == expected.argmax().item()


def test_min_tokens_bans_stop_tokens():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.0]])
    out = Sampler()(logits, metadata(1, temperature=0.0, min_tokens={0: (3, {1})}))
    assert out.sampled_token_ids.item() == 2


def test_logprobs_are_log_softmax_of_raw_logits():
    logits = torch.randn(4, V)
    temps = torch.tensor([0.0, 0.5, 1.0, 2.0])
    out = Sampler()(logits, metadata(4, temperature=temps, logprobs=3, top_k=torch.full((4,), 5)))
    ref = logits.log_softmax(-1)
    lp = out.logprobs_tensors
    sampled = out.sampled_token_ids
    assert torch.equal(lp.logprob_token_ids[:, 0], sampled)
    assert torch.allclose(lp.logprobs[:, 0], ref.gather(1, sampled[:, None])[:, 0])
    assert torch.equal(lp.logprob_token_ids[:, 1:], ref.topk(3).indices)
    assert torch.allclose(lp.logprobs[:, 1:], ref.topk(3).values)
    ranks = (ref > ref.gather(1, sampled[:, None])).sum(-1) + 1
    assert torch.equal(lp.selected_token_ranks, ranks)
    zero = Sampler()(logits, metadata(4, temperature=0.0, logprobs=0)).logprobs_tensors
    assert zero.logprobs.shape == (4, 1)
