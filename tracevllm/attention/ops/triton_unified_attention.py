"""``unified_attention``: paged attention for a whole mixed batch in one Triton launch.

Decode, prefill and chunked prefill over a cached prefix are one case (see
``attention/backends/abstract.py``): sequence ``s`` owns query rows
``query_start_loc[s]:query_start_loc[s + 1]``, the last ``q_len`` of its ``seq_len`` tokens, so its
query ``j`` sits at position ``context_len + j`` with ``context_len = seq_len - q_len`` and sees the
keys at positions ``<= context_len + j`` (and ``> position - sliding_window`` with a window).

**The tile.** A program owns ``BLOCK_Q`` consecutive query tokens of one sequence and one KV head.
The ``G = num_heads / num_kv_heads`` query heads that share that KV head are packed into the rows of
one ``BLOCK_M = BLOCK_Q * G``-row tile (``BLOCK_M`` = 16, or the next power of two above ``G``;
``PREFILL_BLOCK_M`` when a sequence has that many query rows), so every K/V element loaded serves
all ``G`` heads. For GQA 3:1 (``G = 3``, ``BLOCK_Q = 5``)::

    tile row m:   0   1   2   3   4   5  ...  12  13  14  15
    query token:  t   t   t  t+1 t+1 t+1 ...  t+4 t+4 t+4  -    (t + m // G; row 15 is unused)
    query head:  3h 3h+1 3h+2 3h 3h+1 3h+2 ... 3h 3h+1 3h+2  -    (h * G + m % G)

It walks the sequence's keys in tiles of ``TILE`` positions (``kv_tile_size``); key position
``p`` is read from physical block ``block_table[s, p // block_size]`` at row ``p % block_size``, so
a tile may span several cache blocks. Per KV tile: ``S = Q K^T`` ``[BLOCK_M, TILE]``, the causal/window mask, then
the online softmax (running max ``m``, running sum ``l``, rescaled accumulator; in base 2, with
``log2(e)`` folded into the scale). Only the tiles up to the tile's last query position are visited.

**The grid needs no device-to-host sync.** Sequence ``s``'s query blocks get program ids from
``query_start_loc[s] // BLOCK_Q + s``: each sequence needs at most ``q_len // BLOCK_Q + 1`` blocks, so
this never overlaps, and ``num_tokens // BLOCK_Q + num_seqs`` programs (known on the host) cover
every block. A program finds its sequence by binary search over ``query_start_loc``; ids that fall
past their sequence's last block exit at once.

**Split-KV** (``num_segments > 1``, for decode batches of few sequences with long contexts, where
one program per (sequence, KV head) would leave most of a GPU idle): a third grid axis cuts each
sequence's KV tiles into segments; each program writes its partial ``(m, l, acc)`` and
``_reduce_segments`` combines them: ``out = sum_i acc_i 2^(m_i - M) / sum_i l_i 2^(m_i - M)``.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

# The sizes below were chosen by measuring them on an H100 (bf16, ``tracevllm bench kernels`` and a
# sweep of the tile sizes): docs/perf-log.md#triton-tile-sizes.
NUM_SEGMENTS = 16
# Split-KV only pays when (sequences x KV heads) programs would leave SMs idle (an H100 has 132)...
_SPLIT_KV_MAX_PROGRAMS = 128
# ...and when the context is long enough that the extra launch and the partials cost less than the
# parallelism gains.
_SPLIT_KV_MIN_SEQ_LEN = 4096
# Query-tile rows (BLOCK_M) for batches where a sequence has enough query tokens to fill them: more
# rows per program reuse each K/V tile for more queries, which is what prefill needs.
PREFILL_BLOCK_M = 64


def kv_tile_size(head_dim_padded: int) -> int:
    """Key positions per KV tile. Wider tiles spread each tile's softmax bookkeeping over more keys,
    up to where a tile no longer fits in registers: 128 keys for head_dim 64, 64 for head_dim 128
    (measured: docs/perf-log.md#triton-tile-sizes)."""
    return 128 if head_dim_padded <= 64 else 64


# Triton compiles a kernel again for each new class of an integer argument's value (1, a multiple of
# 16, any other), as it would for a new constexpr. ``num_seqs`` changes every step, so left to that,
# a batch of a new class compiles a new variant mid-serving (docs/perf-log.md#h200-cuda-graphs). Not
# specialised, one compile serves every batch.
NOT_SPECIALISED = ["num_seqs"]


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence ``s`` whose first query block ``query_start_loc[s] // BLOCK_Q + s`` is
    ``<= q_block_global`` (binary search)."""
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_global:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit(do_not_specialize=NOT_SPECIALISED)
def _unified_attention_kernel(
    out_ptr, seg_acc_ptr, seg_max_ptr, seg_sum_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr,
    block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale_log2,  # softmax scale * log2(e)
    num_seqs,
    q_stride_t, q_stride_h, out_stride_t, out_stride_h,
    cache_stride_block, cache_stride_slot, cache_stride_head,
    block_table_stride,
    num_heads,
    G: tl.constexpr,  # query heads per KV head
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,  # 0: off
    SEGMENTS: tl.constexpr,  # 1: write the output; > 1: write partial results (split-KV)
    DOT_FP32: tl.constexpr,  # upcast before tl.dot (float32 input, or bf16 under the interpreter)
):
    q_block_global = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    seq = _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = q_block_global - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    offs_n = tl.arange(0, TILE)
    q_local = q_block * BLOCK_Q + offs_m // G  # index of each row's query within the sequence
    head = kv_head * G + offs_m % G
    row_ok = (offs_m // G < BLOCK_Q) & (q_local < q_len)
    d_ok = offs_d < HEAD_DIM
    token = (q_start + q_local).to(tl.int64)

    q = tl.load(q_ptr + token[:, None] * q_stride_t + head[:, None] * q_stride_h + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len
    q_pos = context_len + q_local
    # Keys this tile of queries can see: [first_key, num_keys).
    num_keys = context_len + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    first_key = 0
    if SLIDING_WINDOW > 0:
        first_key = tl.maximum(context_len + q_block * BLOCK_Q - SLIDING_WINDOW + 1, 0)
    tile_start = first_key // TILE
    tile_end = tl.cdiv(num_keys, TILE)
    if SEGMENTS > 1:
        per_segment = tl.cdiv(tile_end - tile_start, SEGMENTS)
        tile_start = tile_start + segment * per_segment
        tile_end = tl.minimum(tile_end, tile_start + per_segment)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], tl.float32)
    kv_head_offset = kv_head.to(tl.int64) * cache_stride_head
    for tile in range(tile_start, tile_end):
        k_pos = tile * TILE + offs_n
        k_ok = k_pos < num_keys
        block = tl.load(block_table_ptr + seq.to(tl.int64) * block_table_stride + k_pos // BLOCK_SIZE,
                        mask=k_ok, other=0).to(tl.int64)
        slot_offset = block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot + kv_head_offset
        k = tl.load(k_cache_ptr + slot_offset[None, :] + offs_d[:, None],
                    mask=k_ok[None, :] & d_ok[:, None], other=0.0)  # [HEAD_DIM_PADDED, TILE]
        v = tl.load(v_cache_ptr + slot_offset[:, None] + offs_d[None, :],
                    mask=k_ok[:, None] & d_ok[None, :], other=0.0)  # [TILE, HEAD_DIM_PADDED]
        if DOT_FP32:  # "ieee": a GPU would otherwise dot float32 in tf32
            s = tl.dot(q, k.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = s * scale_log2
        allowed = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if SLIDING_WINDOW > 0:
            allowed = allowed & (q_pos[:, None] - k_pos[None, :] < SLIDING_WINDOW)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    mask = row_ok[:, None] & d_ok[None, :]
    if SEGMENTS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # l_i is 0 only on unused rows
        tl.store(out_ptr + token[:, None] * out_stride_t + head[:, None] * out_stride_h + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # Partials in [num_tokens, num_heads, SEGMENTS(, HEAD_DIM_PADDED)]; an empty segment writes
        # m = -inf, l = 0, acc = 0, which the reduction weighs by 0.
        seg_row = (token * num_heads + head) * SEGMENTS + segment
        tl.store(seg_max_ptr + seg_row, m_i, mask=row_ok)
        tl.store(seg_sum_ptr + seg_row, l_i, mask=row_ok)
        tl.store(seg_acc_ptr + seg_row[:, None] * HEAD_DIM_PADDED + offs_d[None, :], acc, mask=mask)


@triton.jit(do_not_specialize=NOT_SPECIALISED)
def _reduce_segments(
    out_ptr, seg_acc_ptr, seg_max_ptr, seg_sum_ptr, query_start_loc_ptr,
    out_stride_t, out_stride_h, num_heads, num_seqs,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, SEGMENTS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if token >= tl.load(query_start_loc_ptr + num_seqs):
        return  # a padding token: no partials were written for it
    offs_s = tl.arange(0, SEGMENTS)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    seg_row = (token * num_heads + head) * SEGMENTS + offs_s
    seg_max = tl.load(seg_max_ptr + seg_row)
    seg_sum = tl.load(seg_sum_ptr + seg_row)
    overall_max = tl.max(seg_max, axis=0)
    weight = tl.exp2(seg_max - tl.where(overall_max == float("-inf"), 0.0, overall_max))
    total = tl.sum(seg_sum * weight, axis=0)
    acc = tl.load(seg_acc_ptr + seg_row[:, None] * HEAD_DIM_PADDED + offs_d[None, :])
    out = tl.sum(acc * weight[:, None], axis=0) / total
    tl.store(out_ptr + token * out_stride_t + head * out_stride_h + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


def use_split_kv(num_seqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int) -> bool:
    """Split-KV for decode-only batches whose (sequence, KV head) programs are too few to fill a
    GPU, and whose contexts are long enough to be worth cutting into segments."""
    return (max_query_len == 1 and num_seqs * num_kv_heads <= _SPLIT_KV_MAX_PROGRAMS
            and max_seq_len >= _SPLIT_KV_MIN_SEQ_LEN)


def unified_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim]; rows >= num_actual_tokens are not written
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    block_table: torch.Tensor,  # [num_seqs, max_blocks] int32
    num_actual_tokens: int,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    sliding_window: int | None = None,
    split_kv: bool | None = None,  # None: decide by use_split_kv
) -> None:
    num_seqs = seq_lens.shape[0]
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if num_actual_tokens == 0:
        return
    assert q.stride(2) == 1 and out.stride(2) == 1 and key_cache.is_contiguous() and value_cache.is_contiguous()
    assert block_table.stride(1) == 1
    g = num_heads // num_kv_heads
    block_m = 16 if g <= 16 else triton.next_power_of_2(g)
    if max_query_len * g >= PREFILL_BLOCK_M > block_m:
        block_m = PREFILL_BLOCK_M
    block_q = block_m // g
    head_dim_padded = max(16, triton.next_power_of_2(head_dim))  # a tl.dot dimension: >= 16
    if split_kv is None:
        split_kv = use_split_kv(num_seqs, num_kv_heads, max_query_len, max_seq_len)
    segments = NUM_SEGMENTS if split_kv else 1
    # The interpreter computes bf16 dots wrongly; float32 inputs are dotted in float32 anyway.
    dot_fp32 = q.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"

    if split_kv:
        seg_max = torch.empty(num_actual_tokens, num_heads, segments, dtype=torch.float32, device=q.device)
        seg_sum = torch.empty_like(seg_max)
        seg_acc = torch.empty(num_actual_tokens, num_heads, segments, head_dim_padded, dtype=torch.float32,
                              device=q.device)
    else:
        seg_max = seg_sum = seg_acc = out  # unused
    grid = (num_actual_tokens // block_q + num_seqs, num_kv_heads, segments)
    _unified_attention_kernel[grid](
        out, seg_acc, seg_max, seg_sum,
        q, key_cache, value_cache,
        block_table, seq_lens, query_start_loc,
        scale * math.log2(math.e),
        num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_table.stride(0),
        num_heads,
        G=g, BLOCK_SIZE=block_size, TILE=kv_tile_size(head_dim_padded), HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=head_dim_padded, BLOCK_Q=block_q, BLOCK_M=block_m, SLIDING_WINDOW=sliding_window or 0, SEGMENTS=segments,
        DOT_FP32=dot_fp32,
    )
    if split_kv:
        _reduce_segments[(num_actual_tokens, num_heads)](
            out, seg_acc, seg_max, seg_sum, query_start_loc, out.stride(0), out.stride(1), num_heads, num_seqs,
            HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded, SEGMENTS=segments,
        )
