"""Optimisation "rope_cache" (layers/rope_cache.py): one module serves every layer whose RoPE rotates
alike, gathers cos/sin once per positions tensor, and rotates as the plain module does."""

from __future__ import annotations

import torch

from tracevllm.layers.rope_cache import RopeCache
from tracevllm.layers.rotary_embedding import get_rope

DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}


def test_serves_only_a_rope_that_rotates_alike():
    cache = RopeCache(get_rope(16, 64, DEFAULT))
    assert cache.serves(get_rope(16, 64, DEFAULT))
    assert not cache.serves(get_rope(16, 64, {**DEFAULT, "rope_theta": 500000.0}))
    assert not cache.serves(get_rope(32, 64, DEFAULT))


def test_gathers_once_per_positions_tensor_and_rotates_as_the_plain_module(monkeypatch):
    rope = get_rope(16, 64, DEFAULT)
    cache, gathers = RopeCache(rope), []
    cos_sin = rope.cos_sin
    monkeypatch.setattr(rope, "cos_sin", lambda positions, dtype: gathers.append(positions) or cos_sin(positions, dtype))
    q, k = torch.randn(5, 2 * 16), torch.randn(5, 16)
    positions = torch.tensor([0, 1, 2, 7, 9])
    for _ in range(3):  # three layers of one forward
        out_q, out_k = cache(positions, q, k)
    assert len(gathers) == 1
    cache(positions.clone(), q, k)  # the next step: a new tensor, gathered again
    assert len(gathers) == 2
    plain_q, plain_k = get_rope(16, 64, DEFAULT)(positions, q, k)
    assert torch.equal(out_q, plain_q) and torch.equal(out_k, plain_k)
