"""Bad words: ban the token that would complete a banned token sequence (vLLM's rule).

A bad word is a token sequence ``w``. At each step, if the output so far ends with ``w[:-1]`` (always
true for a one-token word), the row may not pick ``w[-1]``. Only the generated tokens count, not the
prompt, so a word the prompt ends with half-way may still be completed, as in vLLM.
"""

from __future__ import annotations

import torch


def apply_bad_words(
    logits: torch.Tensor, bad_words_token_ids: dict[int, list[list[int]]], output_token_ids: list[list[int]]
) -> torch.Tensor:
    """``logits`` with the banned tokens of each row at -inf (a copy when anything is banned)."""
    rows: list[int] = []
    cols: list[int] = []
    for row, words in bad_words_token_ids.items():
        past = output_token_ids[row]
        for word in words:
            prefix = word[:-1]
            if len(prefix) > len(past):
                continue
            if not prefix or past[-len(prefix):] == prefix:
                rows.append(row)
                cols.append(word[-1])
    if not rows:
        return logits
    logits = logits.clone()
    logits[rows, cols] = float("-inf")
    return logits
