"""Optimisation "rope_cache": one RoPE module for every layer, gathering a step's cos/sin once.

In a forward every attention layer rotates its q and k by the same positions. Plain, each layer's
``RotaryEmbedding`` gathers cos and sin for them again (two ``[T, D]`` gathers and casts a layer).
``RopeCache`` wraps one of them and is swapped in for every layer whose RoPE rotates alike; it keeps
the last gather, recognised by the positions tensor itself: the same object in every layer of a
forward, a new one the next step.
"""

from __future__ import annotations

import torch
from torch import nn

from tracevllm.layers.rotary_embedding import RotaryEmbedding


class RopeCache(nn.Module):
    def __init__(self, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.rope = rope
        self._step: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None  # positions, dtype, cos, sin

    def serves(self, rope: RotaryEmbedding) -> bool:
        """Whether ``rope`` rotates exactly as the wrapped module does (so this can take its place)."""
        mine = self.rope
        return (mine.head_dim == rope.head_dim and mine.cos_cache.shape == rope.cos_cache.shape
                and torch.equal(mine.cos_cache, rope.cos_cache) and torch.equal(mine.sin_cache, rope.sin_cache))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        step = self._step
        if step is None or step[0] is not positions or step[1] != q.dtype:
            step = self._step = (positions, q.dtype, *self.rope.cos_sin(positions, q.dtype))
        return self.rope.op(q, k, step[2], step[3], self.rope.head_dim)
