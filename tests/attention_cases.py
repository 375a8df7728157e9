"""Paged-attention cases shared by the backend tests: a batch of requests scattered over a NaN-poisoned
paged cache, run through a backend and checked against a plain-torch reference on contiguous K/V.

Each case draws fresh random inputs from its own seed and scatters the requests over shuffled,
non-contiguous blocks. Every cache slot that holds no token is NaN, and so are the block-table
entries past a request's last block (they point at a NaN block), and the output buffer before the
call: a missed write, a wrong slot or a key read from outside a request's sequence makes the result
NaN or wrong, even where that key would have been masked out (``0 * NaN`` is NaN).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tracevllm.attention.backends.abstract import AttentionMetadata
from tracevllm.attention.backends.torch_attn import TorchAttentionBackend
from tracevllm.optimizations import OptimizationConfig

NAN = float("nan")
NUM_PADDING_TOKENS = 2  # trailing tokens with slot -1: never written, their output never read


def reference(query, keys, values, query_lens, scale, window):
    """Request by request: the whole K/V sequence (kept apart, never read from the cache), K/V heads
    repeated for GQA, an explicit causal (and sliding-window) mask, softmax in float64."""
    outs, start = [], 0
    for k, v, q_len in zip(keys, values, query_lens):
        seq_len, group = k.shape[0], query.shape[1] // k.shape[1]
        kk = k.double().repeat_interleave(group, dim=1)  # [seq_len, heads, D]
        vv = v.double().repeat_interleave(group, dim=1)
        q = query[start: start + q_len].double()
        scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
        q_idx = torch.arange(seq_len - q_len, seq_len).view(-1, 1)  # the query rows are the last q_len
        kv_idx = torch.arange(seq_len).view(1, -1)
        visible = kv_idx <= q_idx
        if window is not None:
            visible &= kv_idx > q_idx - window  # transformers' sliding_window_overlay
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, vv))
        start += q_len
    return torch.cat(outs)


def run_case(seed, mix, num_heads, num_kv_heads, head_dim, block_size, dtype, window=None,
             backend=TorchAttentionBackend, device="cpu", disabled=frozenset()):
    """``mix``: one ``(query_len, context_len)`` per request. Inputs are built on the CPU and moved
    to ``device`` for the call, the metadata through the backend's builder with the optimisations
    ``disabled`` off (the cpu backend chooses its ops from them); returns the output rows of the real
    tokens, on the CPU."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    query_lens = [q for q, _ in mix]
    seq_lens = [q + c for q, c in mix]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3  # the spare blocks stay NaN
    physical = rng.sample(range(num_blocks), num_blocks)
    # Wider than any request needs; the unused entries point at a NaN block.
    block_table = torch.full((len(mix), max(blocks_per_req) + 2), physical[-1], dtype=torch.int32)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(cache_shape, NAN, dtype=dtype)
    value_cache = torch.full(cache_shape, NAN, dtype=dtype)

    keys, values, slots, new_keys, new_values = [], [], [], [], []
    for i, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens)):
        block_table[i, : blocks_per_req[i]] = torch.tensor([physical.pop(0) for _ in range(blocks_per_req[i])])
        k, v = randn(seq_len, num_kv_heads, head_dim), randn(seq_len, num_kv_heads, head_dim)
        keys.append(k)
        values.append(v)
        context_len = seq_len - query_len
        for pos in range(seq_len):
            block, offset = int(block_table[i, pos // block_size]), pos % block_size
            if pos < context_len:  # computed in an earlier step: already cached
                key_cache[block, offset] = k[pos]
                value_cache[block, offset] = v[pos]
            else:
                slots.append(block * block_size + offset)
        new_keys.append(k[context_len:])
        new_values.append(v[context_len:])

    num_tokens = sum(query_lens)
    # Views into one fused [tokens, heads + 2 * kv_heads, D] tensor, as a model's qkv projection gives.
    qkv = torch.cat([
        randn(num_tokens + NUM_PADDING_TOKENS, num_heads, head_dim),
        torch.cat([*new_keys, randn(NUM_PADDING_TOKENS, num_kv_heads, head_dim)]),
        torch.cat([*new_values, randn(NUM_PADDING_TOKENS, num_kv_heads, head_dim)]),
    ], dim=1)
    query, key, value = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    slot_mapping = torch.tensor(slots + [-1] * NUM_PADDING_TOKENS, dtype=torch.int64)
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    md = AttentionMetadata(
        num_actual_tokens=len(slot_mapping), max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_start_loc=torch.from_numpy(query_start_loc).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=block_table.to(device), slot_mapping=slot_mapping.to(device),
        query_start_loc_cpu=query_start_loc, seq_lens_cpu=np.array(seq_lens, dtype=np.int32),
    )
    scale = head_dim ** -0.5
    impl = backend.get_impl_cls()(num_heads, head_dim, num_kv_heads, scale, window)
    md = backend.get_builder_cls()(impl, dtype, block_size, OptimizationConfig(frozenset(disabled))).build(md)
    key_before, value_before = key_cache.clone(), value_cache.clone()
    qkv, dev_key_cache, dev_value_cache = qkv.to(device), key_cache.to(device), value_cache.to(device)
    query, key, value = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)

    # The backend allocates its output with torch.empty_like: make that NaN, so a row it never
    # writes cannot pass by luck.
    allocations = []

    def nan_empty_like(t, *args, **kwargs):
        allocations.append(t.shape)
        return torch.full_like(t, NAN, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "empty_like", nan_empty_like)
        out = impl.forward(query, key, value, (dev_key_cache, dev_value_cache), md)
    assert query.shape in allocations, "the output is no longer allocated with torch.empty_like"
    out, query, key, value = out.cpu(), query.cpu(), key.cpu(), value.cpu()
    key_cache, value_cache = dev_key_cache.cpu(), dev_value_cache.cpu()

    assert out.shape == query.shape and out.dtype == dtype
    expected = reference(query.float(), keys, values, query_lens, scale, window)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out[:num_tokens].double(), expected, atol=tol, rtol=tol)

    # The cache holds this step's K/V at exactly its slots; every other slot is as it was.
    step = slot_mapping[:num_tokens]
    for cache, before, new in ((key_cache, key_before, key), (value_cache, value_before, value)):
        flat, flat_before = cache.view(-1, num_kv_heads, head_dim), before.view(-1, num_kv_heads, head_dim)
        assert torch.equal(flat[step], new[:num_tokens])
        untouched = torch.ones(flat.shape[0], dtype=torch.bool)
        untouched[step] = False
        torch.testing.assert_close(flat[untouched], flat_before[untouched], rtol=0, atol=0, equal_nan=True)
    return out[:num_tokens]


MIXES = {
    "decode_only": [(1, 17), (1, 40), (1, 0), (1, 63)],
    "prefill_only": [(9, 0), (33, 0), (2, 0)],
    "chunked_over_context": [(7, 21), (16, 16), (5, 50)],
    "mixed": [(1, 30), (12, 0), (1, 5), (20, 13), (1, 64), (3, 1)],
    # Decode rows of scattered lengths, so they split into several buckets of similar length.
    "decode_long_tail": [(1, 6), (1, 200), (1, 30), (1, 7), (1, 180), (1, 31), (1, 5), (1, 199)],
}
HEADS = {"mha": (4, 4), "gqa3": (6, 2), "gqa4": (8, 2), "gqa5": (5, 1)}


def random_mix(rng: random.Random) -> list[tuple[int, int]]:
    kinds = {
        "decode": lambda: (1, rng.randint(0, 90)),
        "prefill": lambda: (rng.randint(2, 40), 0),
        "chunk": lambda: (rng.randint(2, 30), rng.randint(1, 70)),
    }
    return [kinds[rng.choice(list(kinds))]() for _ in range(rng.randint(1, 7))]
