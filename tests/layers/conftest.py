"""``as_rank``: build tensor-parallel layers as one rank of a group, all in this one process."""

from __future__ import annotations

import pytest

import tracevllm.distributed.parallel_state as parallel_state
import tracevllm.layers.linear as linear_mod
import tracevllm.layers.vocab_parallel_embedding as vocab_mod


@pytest.fixture
def as_rank(monkeypatch):
    """``as_rank(rank, tp)``: layers built afterwards belong to ``rank`` of ``tp``. No collective
    runs (they return their input), so a test performs them itself on the ranks' results."""
    for module in (linear_mod, vocab_mod):
        monkeypatch.setattr(module, "tensor_model_parallel_all_reduce", lambda x: x)
        monkeypatch.setattr(module, "tensor_model_parallel_all_gather", lambda x, dim=-1: x)

    def set_rank(rank: int, tp: int) -> None:
        monkeypatch.setattr(parallel_state, "_TP", parallel_state.GroupCoordinator(tuple(range(tp)), rank))

    return set_rank
