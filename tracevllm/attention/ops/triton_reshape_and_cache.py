"""``reshape_and_cache``: write the step's new K and V rows into the paged caches (Triton).

One program per token ``t``: it copies ``key[t]`` and ``value[t]`` (``num_kv_heads * head_dim``
values each, all heads at once) into physical block ``slot // block_size`` at row
``slot % block_size`` of the caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, where
``slot = slot_mapping[t]``. A slot < 0 marks a padding token: nothing is written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    key_stride_t, value_stride_t,
    cache_stride_block, cache_stride_slot,
    BLOCK_SIZE: tl.constexpr,
    ROW: tl.constexpr,  # num_kv_heads * head_dim
    ROW_PADDED: tl.constexpr,  # ROW rounded up to a power of two (tl.arange needs one)
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs = tl.arange(0, ROW_PADDED)
    in_row = offs < ROW
    dst = (slot // BLOCK_SIZE) * cache_stride_block + (slot % BLOCK_SIZE) * cache_stride_slot + offs
    k = tl.load(key_ptr + token * key_stride_t + offs, mask=in_row, other=0.0)
    v = tl.load(value_ptr + token * value_stride_t + offs, mask=in_row, other=0.0)
    tl.store(key_cache_ptr + dst, k, mask=in_row)
    tl.store(value_cache_ptr + dst, v, mask=in_row)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """``key``, ``value`` ``[num_tokens, num_kv_heads, head_dim]`` (rows may be strided views, heads
    and dims contiguous); caches ``[num_blocks, block_size, num_kv_heads, head_dim]`` contiguous;
    ``slot_mapping`` ``[n]`` with ``n <= num_tokens``: only the first ``n`` tokens are written."""
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    row = num_kv_heads * head_dim
    for t in (key, value):
        assert t.stride(2) == 1 and t.stride(1) == head_dim, "heads and dims of a token must be contiguous"
    assert key_cache.is_contiguous() and value_cache.is_contiguous() and key_cache.stride() == value_cache.stride()
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), value.stride(0),
        key_cache.stride(0), key_cache.stride(1),
        BLOCK_SIZE=block_size, ROW=row, ROW_PADDED=triton.next_power_of_2(row),
    )
