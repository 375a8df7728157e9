"""Vocabulary-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary."""

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
from tracevllm.layers.linear import linear


class VocabParallelEmbedding(nn.Module):
    """Rows ``[vocab_start, vocab_end)`` of the embedding live on this rank. A token owned by another
    rank embeds to zeros here, and the all-reduce sums the one non-zero row across ranks."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * per_rank
        self.vocab_end = min(self.vocab_start + per_rank, num_embeddings)
        # Padded to per_rank rows so every rank's slice has the same shape (for the all-gather).
        self.weight = nn.Parameter(torch.empty(per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        shard = loaded_weight[self.vocab_start : self.vocab_end]
        param.data[: shard.shape[0]].copy_(shard)
        param.data[shard.shape[0] :].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        owned = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(owned, input_ids - self.vocab_start, 0)
        out = F.embedding(local, self.weight) * owned.unsqueeze(-1)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, split by vocabulary like the embedding (and sharing its weight when tied)."""

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        self.weight = embed_tokens.weight

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` -> float32 ``[N, vocab_size]``, gathered from every rank's slice."""
        logits = linear(hidden_states, self.weight)
        logits = tensor_model_parallel_all_gather(logits)
        return logits[:, : self.num_embeddings].float()
