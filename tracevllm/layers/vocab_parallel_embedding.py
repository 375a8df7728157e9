"""Vocabulary-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary.

With ``V`` tokens and ``tp`` ranks, every rank holds ``ceil(V / tp)`` rows (the last rank's tail is
zero padding, so that all slices have one shape for the all-gather)::

    rank 0: token ids [0, n)    rank 1: [n, 2n)    ...    rank tp-1: [(tp-1) n, V) + padding
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tracevllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from tracevllm.layers.linear import LinearMethodBase, UnquantizedLinearMethod, copy_checked


class VocabParallelEmbedding(nn.Module):
    """A token owned by another rank embeds to zeros here; the all-reduce then sums the one
    non-zero row across ranks."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.num_embeddings_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = min(self.tp_rank * self.num_embeddings_per_rank, num_embeddings)
        self.vocab_end = min(self.vocab_start + self.num_embeddings_per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id=None) -> None:
        if loaded_weight.shape != (self.num_embeddings, param.shape[1]):
            raise ValueError(f"checkpoint tensor has shape {tuple(loaded_weight.shape)}, "
                             f"expected {(self.num_embeddings, param.shape[1])}")
        owned = self.vocab_end - self.vocab_start
        copy_checked(param.data[:owned], loaded_weight[self.vocab_start : self.vocab_end])
        param.data[owned:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        owned = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(owned, input_ids - self.vocab_start, 0)
        out = F.embedding(local_ids, self.weight) * owned.unsqueeze(-1)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, split by vocabulary like the embedding (and sharing its weight when
    the model ties them). Each rank scores its own vocabulary slice; ``compute_logits`` gathers.
    The product is a linear layer's: it runs through a ``linear_method`` as theirs does."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.linear_method: LinearMethodBase = UnquantizedLinearMethod()

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        self.weight = embed_tokens.weight

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` -> float32 ``[N, vocab_size]``, gathered from every rank's slice."""
        logits = self.linear_method.apply(self, hidden_states)
        logits = tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[:, : self.num_embeddings].float()
