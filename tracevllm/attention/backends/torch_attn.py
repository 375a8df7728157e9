"""The plain-PyTorch paged attention backend: SDPA on K/V gathered from the cache, the reference path.

Per layer and step, ``forward`` first writes the step's K/V rows into the paged cache at
``slot_mapping`` (slot -1 marks padding and is skipped), then attends. The work is planned on the
host copies of the metadata (``query_start_loc_cpu``, ``seq_lens_cpu``), so it needs no device sync:

* **Decode rows** (query_len 1) are sorted by the number of keys they see (``span``: the whole
  sequence, or only its last ``sliding_window`` keys) and cut into buckets of similar span; each
  bucket is ONE ``scaled_dot_product_attention`` call, so a single long request does not make
  every short one pad to its length. A bucket's keys are gathered from the cache through the
  block tables into a padded batch of ``span`` keys, and the query heads that share a KV head are
  folded into query rows, so K and V are read once per KV head, never repeated::

      q [n, kv_heads, group, D]  x  K, V [n, kv_heads, span, D]  ->  [n, kv_heads, group, D]

  A row shorter than ``span`` gathers its own last key again in place of the missing ones and
  masks them out: the gather never touches a slot (or a block-table entry) the row does not own,
  so stale or NaN values in unused cache slots cannot leak in through ``0 * NaN``.

* **Prefill rows** (query_len > 1, with or without cached context) run one SDPA each. With no
  cached context the fresh K/V are used as they are (``is_causal``); with a cached prefix, the
  whole sequence is gathered from the cache (after this step's write) under a causal mask shifted
  by the context length: query row ``j`` sits at position ``context_len + j``.

Positions and masks (``_allowed``): a query at position ``q`` sees the key at position ``k`` iff
``k <= q`` and, with a sliding window ``w``, ``q - k < w``; that is, the query and the ``w - 1``
keys before it, as ``sliding_window_overlay`` in Hugging Face transformers (Mistral, Qwen2).

Gathers write into one workspace shared by all layers (``_Workspace``) rather than fresh tensors.
Output rows past ``query_start_loc_cpu[-1]`` (padding tokens) are left unwritten.

On a CPU the engine runs this backend's idea faster in ``cpu_attn.py``: C++ ops that read K/V in
place, and the step's rows and buckets worked out once for all layers.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tracevllm.attention.backends.abstract import AttentionBackend, AttentionImpl, AttentionMetadata


class _Workspace(threading.local):
    """Scratch for the K/V gathers, shared by all layers of a thread's model: the layers run one
    after another and each is done with its gathered K/V before the next gathers, so reusing one
    buffer saves allocating (and, on CPU, page-faulting in) fresh multi-MB tensors per layer."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def get(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buf = self.buffers.get((device, dtype))
        if buf is None or buf.numel() < numel:
            # Grow geometrically: decode contexts grow by a token per step.
            size = max(numel, 2 * buf.numel()) if buf is not None else numel
            # A normal tensor, not an inference one: inference mode may write into a normal
            # tensor, but code outside inference mode may not write into an inference tensor.
            with torch.inference_mode(False):
                buf = self.buffers[(device, dtype)] = torch.empty(size, dtype=dtype, device=device)
        return buf[:numel]


_workspace = _Workspace()


@dataclass(slots=True)
class DecodeBucket:
    """Decode rows attended in one SDPA call: their query rows, the cache slots of their (padded)
    ``span`` keys each, and the mask of the keys each may see."""

    tokens: torch.Tensor  # [n] int64
    slots: torch.Tensor  # [n * span] int64
    mask: torch.Tensor  # [n, 1, 1, span] bool
    span: int


@dataclass(slots=True)
class StepRows:
    """What every layer of a step reads alike from the metadata: the rows that decode, the rows that
    prefill, and whether every token has a cache slot (slot -1 marks a padding token)."""

    decode: np.ndarray
    prefill: list[int]
    all_slotted: bool

    @classmethod
    def of(cls, md: AttentionMetadata) -> StepRows:
        query_lens = np.diff(md.query_start_loc_cpu)
        return cls(np.flatnonzero(query_lens == 1), np.flatnonzero(query_lens > 1).tolist(),
                   bool((md.slot_mapping >= 0).all()))


class TorchAttentionImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        md = attn_metadata
        rows = StepRows.of(md)
        flat_k, flat_v = self._write_kv(key, value, kv_cache, md.slot_mapping, rows.all_slotted)
        block_size = kv_cache[0].shape[1]
        output = torch.empty_like(query)
        if len(rows.decode):
            self._decode(query, flat_k, flat_v, self._decode_buckets(md, block_size, rows.decode), output)
        for row in rows.prefill:
            self._prefill(query, key, value, flat_k, flat_v, block_size, md, row, output)
        return output

    def _write_kv(self, key, value, kv_cache: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor,
                 all_slotted: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's K/V rows at their slots; returns the caches as ``[num_slots, kv_heads, D]``."""
        flat_k, flat_v = (cache.view(-1, self.num_kv_heads, self.head_dim) for cache in kv_cache)
        n = slot_mapping.shape[0]
        key, value = key[:n], value[:n]
        if not all_slotted:
            keep = slot_mapping >= 0  # slot -1: a padding token, never written
            slot_mapping, key, value = slot_mapping[keep], key[keep], value[keep]
        flat_k.index_copy_(0, slot_mapping, key)
        flat_v.index_copy_(0, slot_mapping, value)
        return flat_k, flat_v

    def _allowed(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """True where a query at ``q_pos`` may attend to a key at ``k_pos`` (broadcast)."""
        allowed = k_pos <= q_pos
        if self.sliding_window is not None:
            allowed &= q_pos - k_pos < self.sliding_window
        return allowed

    @staticmethod
    def _slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
        """Cache slots of token ``positions`` ``[..., L]`` of the requests with these block-table
        rows ``[..., max_blocks]``."""
        block_ids = block_table.gather(-1, positions // block_size).long()
        return block_ids * block_size + positions % block_size

    def _decode(self, query, flat_k, flat_v, buckets: list[DecodeBucket], output: torch.Tensor) -> None:
        for bucket in buckets:
            n, span = len(bucket.tokens), bucket.span
            k, v = self._gather(flat_k, flat_v, bucket.slots)
            k = k.view(n, span, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(n, span, self.num_kv_heads, self.head_dim).transpose(1, 2)
            group = self.num_heads // self.num_kv_heads
            q = query.index_select(0, bucket.tokens).view(n, self.num_kv_heads, group, self.head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bucket.mask, scale=self.scale)
            output.index_copy_(0, bucket.tokens, out.reshape(n, self.num_heads, self.head_dim))

    def _decode_buckets(self, md: AttentionMetadata, block_size: int, rows: np.ndarray) -> list[DecodeBucket]:
        """The decode ``rows`` cut into buckets of similar span, each with its cache slots and mask.
        They depend only on the step's metadata and this layer's window."""
        spans = md.seq_lens_cpu[rows]
        if self.sliding_window is not None:
            spans = np.minimum(spans, self.sliding_window)
        order = np.argsort(-spans, kind="stable")
        rows, spans = rows[order], spans[order]
        buckets, start = [], 0
        while start < len(rows):
            # A bucket is its longest row and every row whose span exceeds 7/8 of that row's: the
            # padding adds under 1/7 to a row's work, and (measured on CPU) finer buckets lose more
            # to per-call overhead than they save.
            end = start + 1 + int(np.count_nonzero(8 * spans[start + 1:] > 7 * spans[start]))
            buckets.append(self._decode_bucket(md, block_size, rows[start:end], int(spans[start])))
            start = end
        return buckets

    def _decode_bucket(self, md: AttentionMetadata, block_size: int, rows: np.ndarray, span: int) -> DecodeBucket:
        device = md.seq_lens.device
        rows_t = torch.from_numpy(rows).to(device)
        tokens = torch.from_numpy(md.query_start_loc_cpu[rows]).to(device, torch.long)
        q_pos = md.seq_lens[rows_t].long().unsqueeze(1) - 1  # [n, 1]: each row's query position
        k_pos = (q_pos - (span - 1)).clamp(min=0) + torch.arange(span, device=device)  # [n, span]
        slots = self._slots(md.block_table[rows_t], torch.minimum(k_pos, q_pos), block_size)
        mask = self._allowed(q_pos, k_pos).view(len(rows), 1, 1, span)
        return DecodeBucket(tokens, slots.flatten(), mask, span)

    @staticmethod
    def _gather(flat_k, flat_v, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots``, ``[len(slots), kv_heads, D]`` each, in the shared workspace."""
        shape = (len(slots), *flat_k.shape[1:])
        buf = _workspace.get(2 * math.prod(shape), flat_k.dtype, flat_k.device)
        k, v = buf.view(2, *shape).unbind(0)
        torch.index_select(flat_k, 0, slots, out=k)
        torch.index_select(flat_v, 0, slots, out=v)
        return k, v

    def _prefill(self, query, key, value, flat_k, flat_v, block_size: int, md: AttentionMetadata,
                row: int, output: torch.Tensor) -> None:
        start, end = md.query_start_loc_cpu[row : row + 2].tolist()
        seq_len = int(md.seq_lens_cpu[row])
        context_len = seq_len - (end - start)
        device = query.device
        if context_len == 0:
            k, v = key[start:end], value[start:end]
        else:
            slots = self._slots(md.block_table[row], torch.arange(seq_len, device=device), block_size)
            k, v = self._gather(flat_k, flat_v, slots)
        # [tokens, heads, D] -> [1, heads, tokens, D]: SDPA's CPU flash kernel wants 4-D input.
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query[start:end], k, v))
        if context_len == 0 and self.sliding_window is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            q_pos = torch.arange(context_len, seq_len, device=device).unsqueeze(1)
            mask = self._allowed(q_pos, torch.arange(seq_len, device=device))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
        output[start:end] = out.squeeze(0).transpose(0, 1)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TorchAttentionImpl
