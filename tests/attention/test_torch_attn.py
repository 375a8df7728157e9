"""The torch paged-attention backend against a plain-torch reference on contiguous K/V.

Fresh random inputs per case and shuffled block tables. Every cache slot that holds no token is
filled with large garbage (finite, as stale KV in a real cache is), so a wrong slot, a missed write
or a key read past a sequence's end without being masked changes the result.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tracevllm.attention.backends.abstract import AttentionMetadata
from tracevllm.attention.backends.torch_attn import TorchAttentionImpl


POISON = 1000.0


def reference(q, k, v, q_lens, seq_lens, scale, window):
    """Per request: full K/V of the sequence, repeat_interleave for GQA, float64 softmax."""
    outs, qs = [], 0
    for (k_seq, v_seq), q_len, seq_len in zip(zip(k, v), q_lens, seq_lens):
        group = q.shape[1] // k_seq.shape[1]
        kk = k_seq.double().repeat_interleave(group, dim=1)  # [L, H, D]
        vv = v_seq.double().repeat_interleave(group, dim=1)
        qq = q[qs: qs + q_len].double()
        scores = torch.einsum("qhd,khd->hqk", qq, kk) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= q_pos - k_pos < window
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv))
        qs += q_len
    return torch.cat(outs)


def run_case(seed, mix, num_heads, num_kv_heads, head_dim, block_size, dtype, window=None):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    q_lens = [q for q, _ in mix]
    seq_lens = [q + c for q, c in mix]
    max_blocks = max(-(-s // block_size) for s in seq_lens)
    num_blocks = len(mix) * max_blocks + 3
    physical = list(range(num_blocks))
    rng.shuffle(physical)
    block_table = torch.zeros(len(mix), max_blocks, dtype=torch.int32)
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), POISON, dtype=dtype)
    value_cache = key_cache.clone()
    k_full, v_full, slots, new_k, new_v = [], [], [], [], []
    for i, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        n_blocks = -(-seq_len // block_size)
        block_table[i, :n_blocks] = torch.tensor([physical.pop() for _ in range(n_blocks)])
        k = torch.randn(seq_len, num_kv_heads, head_dim).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim).to(dtype)
        k_full.append(k)
        v_full.append(v)
        pos = torch.arange(seq_len)
        slot = block_table[i, pos // block_size].long() * block_size + pos % block_size
        ctx = seq_len - q_len
        key_cache.view(-1, num_kv_heads, head_dim)[slot[:ctx]] = k[:ctx]  # the cached context
        value_cache.view(-1, num_kv_heads, head_dim)[slot[:ctx]] = v[:ctx]
        slots.append(slot[ctx:])
        new_k.append(k[ctx:])
        new_v.append(v[ctx:])
    q = torch.randn(sum(q_lens), num_heads, head_dim).to(dtype)
    key, value = torch.cat(new_k), torch.cat(new_v)
    slot_mapping = torch.cat(slots)
    # One padding token at the end: slot -1, must not be written.
    q = torch.cat([q, torch.randn(1, num_heads, head_dim).to(dtype)])
    key = torch.cat([key, torch.randn(1, num_kv_heads, head_dim).to(dtype)])
    value = torch.cat([value, torch.randn(1, num_kv_heads, head_dim).to(dtype)])
    slot_mapping = torch.cat([slot_mapping, torch.tensor([-1])])

    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    md = AttentionMetadata(
        num_actual_tokens=int(qsl[-1]) + 1, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        query_start_loc=torch.from_numpy(qsl), seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=block_table, slot_mapping=slot_mapping, query_start_loc_cpu=qsl,
        seq_lens_cpu=np.array(seq_lens, dtype=np.int32),
    )
    scale = head_dim ** -0.5
    impl = TorchAttentionImpl(num_heads, head_dim, num_kv_heads, scale, window)
    cache_before = key_cache.clone()
    out = impl.forward(q, key, value, (key_cache, value_cache), md)
    ref = reference(q.float(), [k.float() for k in k_full], [v.float() for v in v_full], q_lens, seq_lens, scale, window)

    tol = 1e-4 if dtype == torch.float32 else 3e-2
    n = int(qsl[-1])
    assert not torch.isnan(out[:n]).any()
    torch.testing.assert_close(out[:n].double(), ref, atol=tol, rtol=tol)
    # Exactly this step's slots were written, with this step's K/V.
    flat_k = key_cache.view(-1, num_kv_heads, head_dim)
    assert torch.equal(flat_k[slot_mapping[:-1]], key[:-1])
    changed = (key_cache != cache_before).any(-1).any(-1).flatten().nonzero().flatten()
    assert set(changed.tolist()) <= set(slot_mapping[:-1].tolist())


MIXES = {
    "decode_only": [(1, 17), (1, 40), (1, 0), (1, 63)],
    "prefill_only": [(9, 0), (33, 0), (2, 0)],
    "chunked_over_context": [(7, 21), (16, 16), (5, 50)],
    "mixed": [(1, 30), (12, 0), (1, 5), (20, 13), (1, 64)],
}


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (8, 2), (10, 2)], ids=["mha", "gqa3", "gqa4", "gqa5"])
def test_matches_reference(mix, heads):
    seed = hash((mix, heads)) % 10000
    run_case(seed, MIXES[mix], *heads, head_dim=64, block_size=16, dtype=torch.float32)


@pytest.mark.parametrize("head_dim, block_size, dtype", [
    (128, 32, torch.float32), (64, 32, torch.float16), (128, 16, torch.bfloat16),
])
def test_shapes_and_dtypes(head_dim, block_size, dtype):
    run_case(7, MIXES["mixed"], 6, 2, head_dim, block_size, dtype)


@pytest.mark.parametrize("mix", ["decode_only", "chunked_over_context", "mixed"])
def test_sliding_window(mix):
    run_case(3, MIXES[mix], 6, 2, 64, 16, torch.float32, window=8)
