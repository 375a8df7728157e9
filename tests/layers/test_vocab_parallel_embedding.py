"""Vocabulary-parallel embedding and LM head, rank by rank in one process (see test_linear.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tracevllm.layers.vocab_parallel_embedding as vocab_mod
from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

VOCAB, HIDDEN = 11, 6  # 11 is split unevenly: tp=4 gives slices of 3, 3, 3, 2 (+1 padding row)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_embedding_and_lm_head_equal_unsplit(as_rank, monkeypatch, tp):
    g = torch.Generator().manual_seed(tp)
    weight = torch.randn(VOCAB, HIDDEN, generator=g)
    ids = torch.tensor([0, 10, 3, 4, 7, 5, 10])
    hidden = torch.randn(3, HIDDEN, generator=g)
    embedded, logit_slices = [], []
    for rank in range(tp):
        as_rank(rank, tp)
        embed = VocabParallelEmbedding(VOCAB, HIDDEN)
        embed.weight.weight_loader(embed.weight, weight)
        embedded.append(embed(ids))  # zeros for the tokens another rank owns
        head = ParallelLMHead(VOCAB, HIDDEN)
        head.tie_weights(embed)
        assert head.weight is embed.weight
        logit_slices.append(F.linear(hidden, head.weight))
    torch.testing.assert_close(sum(embedded), F.embedding(ids, weight))
    # What compute_logits does after the all-gather: concatenate in rank order, drop the padding.
    monkeypatch.setattr(vocab_mod, "tensor_model_parallel_all_gather", lambda x, dim=-1: torch.cat(logit_slices, dim))
    as_rank(0, tp)
    head = ParallelLMHead(VOCAB, HIDDEN)
    head.weight.weight_loader(head.weight, weight)
    logits = head.compute_logits(hidden)
    assert logits.shape == (3, VOCAB) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, hidden @ weight.T)


def test_lm_head_bf16_logits_are_float32(as_rank):
    as_rank(0, 1)
    head = ParallelLMHead(VOCAB, HIDDEN).to(torch.bfloat16)
    head.weight.weight_loader(head.weight, torch.randn(VOCAB, HIDDEN))
    assert head.compute_logits(torch.randn(2, HIDDEN, dtype=torch.bfloat16)).dtype == torch.float32
    with pytest.raises(ValueError, match="shape"):
        head.weight.weight_loader(head.weight, torch.randn(VOCAB + 1, HIDDEN))
