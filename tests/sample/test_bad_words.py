"""apply_bad_words: the token that would complete a banned sequence is -inf, nothing else changes."""

from __future__ import annotations

import torch

from tracevllm.sample.ops.bad_words import apply_bad_words


def banned(logits: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(row == float("-inf")).flatten().tolist() for row in logits]


def test_single_token_word_is_always_banned_multi_token_only_after_its_prefix():
    logits = torch.zeros(3, 10)
    words = {0: [[7]], 1: [[2, 3, 4]], 2: [[2, 3, 4], [5, 6]]}
    out = apply_bad_words(logits, words, [[1], [9, 2, 3], [2, 3, 9]])
    assert banned(out) == [[7], [4], []]
    assert not torch.isinf(logits).any()  # the input is not modified


def test_prefix_longer_than_the_output_is_skipped_and_rows_without_words_untouched():
    logits = torch.zeros(2, 10)
    out = apply_bad_words(logits, {1: [[3, 4, 5], [8]]}, [[3, 4], [4]])
    assert banned(out) == [[], [8]]
    assert apply_bad_words(logits, {}, [[], []]) is logits
