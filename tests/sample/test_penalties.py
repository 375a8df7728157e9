"""Penalties against Hugging Face's RepetitionPenaltyLogitsProcessor, a per-token Python loop for
OpenAI's frequency and presence penalties, and one example worked out by hand."""

from __future__ import annotations

from collections import Counter

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from tracevllm.sample.ops.penalties import (
    apply_all_penalties,
    apply_penalties,
    get_token_bin_counts,
    make_output_token_tensor,
)

V = 12


def pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [V] * (width - len(r)) for r in rows])


def test_bin_counts_ignore_the_padding_id():
    rows = [[1, 1, 5], [], [11, 0, 11, 11]]
    counts = get_token_bin_counts(make_output_token_tensor(rows, V, torch.device("cpu")), V)
    assert counts.shape == (3, V)
    for row, c in zip(rows, counts.tolist()):
        assert c == [Counter(row)[t] for t in range(V)]


def test_output_token_tensor_pads_with_vocab_size():
    out = make_output_token_tensor([[3], [], [4, 5]], V, torch.device("cpu"))
    assert out.tolist() == [[3, V], [V, V], [4, 5]]
    assert make_output_token_tensor([[], []], V, torch.device("cpu")).tolist() == [[V], [V]]


def test_hand_computed_example():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    prompt = torch.tensor([[3, 4, 5, 5]])  # 5 = padding (vocab size)
    output = torch.tensor([[0, 0, 2]])
    got = apply_penalties(
        logits, prompt, output, torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0])
    )
    expected = torch.tensor([[
        2.0 / 2 - 0.25 * 2 - 0.5,  # output twice: repetition, frequency x2, presence
        -1.0,  # never seen
        0.5 / 2 - 0.25 - 0.5,  # output once
        3.0 / 2,  # prompt only: repetition, no frequency or presence
        -2.0 * 2,  # prompt only, negative: multiplied
    ]])
    assert torch.allclose(got, expected)


def test_against_references_on_a_random_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, V, generator=g) * 3
    prompts = [[1, 2, 2, 7], [0], [5, 6, 7, 8, 9], [3, 3]]
    outputs = [[2, 4, 4, 4], [], [9, 10, 0], [11]]
    pres = torch.tensor([0.0, 1.5, -0.5, 2.0])
    freq = torch.tensor([0.3, -1.0, 0.7, 0.0])
    rep = torch.tensor([1.3, 1.0, 0.8, 2.0])
    got = apply_all_penalties(logits, pad(prompts), pres, freq, rep, outputs)

    for i in range(4):
        row = logits[i : i + 1].clone()
        seen = torch.tensor([prompts[i] + outputs[i]])
        row = RepetitionPenaltyLogitsProcessor(penalty=rep[i].item())(seen, row)[0]
        counts = Counter(outputs[i])
        for t, c in counts.items():
            row[t] -= freq[i] * c + pres[i]
        assert torch.allclose(got[i], row, atol=1e-6), i


def test_without_prompt_tensor_only_output_is_seen():
    logits = torch.tensor([[1.0, 1.0, 1.0]])
    got = apply_penalties(
        logits, None, torch.tensor([[1, 3]]), torch.zeros(1), torch.zeros(1), torch.tensor([2.0])
    )
    assert torch.equal(got, torch.tensor([[1.0, 0.5, 1.0]]))


def test_neutral_penalties_change_nothing_and_input_is_not_modified():
    logits = torch.randn(2, V)
    before = logits.clone()
    got = apply_all_penalties(
        logits, pad([[1, 2], [3]]), torch.zeros(2), torch.zeros(2), torch.ones(2), [[4, 4], []]
    )
    assert torch.equal(got, before) and torch.equal(logits, before)


def test_minus_inf_stays_minus_inf():
    logits = torch.tensor([[float("-inf"), 1.0]])
    got = apply_penalties(logits, None, torch.tensor([[0, 0]]), torch.ones(1), torch.ones(1), torch.tensor([1.5]))
    assert got[0, 0] == float("-inf") and not got.isnan().any()
