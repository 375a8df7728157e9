"""The plain-PyTorch paged attention backend: the reference path, and the fast one on CPU.

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

  With optimisation "cpu_paged_decode" (on CPU, by default) all decode rows go instead to one call
  of a C++ op (``attention/ops/cpu_paged_decode.cpp``) that reads each row's K/V in place through
  its block table: the same result without the gathered copy (``_decode_in_place``). With
  optimisation "cpu_amx_decode" as well (bf16 on a CPU with AMX tiles, block sizes that are a
  multiple of 16), that call goes to its AMX twin (``attention/ops/cpu_amx_decode.cpp``), which
  runs the two products on the tiles instead of float32 vector registers.

* **Prefill rows** (query_len > 1, with or without cached context) run one SDPA each. With no
  cached context the fresh K/V are used as they are (``is_causal``); with a cached prefix, the
  whole sequence is gathered from the cache (after this step's write) under a causal mask shifted
  by the context length: query row ``j`` sits at position ``context_len + j``.

  With optimisation "cpu_amx_prefill" (bf16 on a CPU with AMX tiles, by default) all prefill rows
  go instead to one call of a C++ flash attention on AMX tiles (``attention/ops/cpu_amx_prefill.cpp``)
  that reads K/V from the cache through the block tables, with or without a context
  (``_prefill_in_place``). On a CPU with AVX512-BF16 but no AMX, optimisation "cpu_vec_prefill" runs
  the same op with its products on AVX512-BF16 dot-product instructions.

Positions and masks (``_allowed``): a query at position ``q`` sees the key at position ``k`` iff
``k <= q`` and, with a sliding window ``w``, ``q - k < w``; that is, the query and the ``w - 1``
keys before it, as ``sliding_window_overlay`` in Hugging Face transformers (Mistral, Qwen2).

Gathers write into one workspace shared by all layers (``_Workspace``) rather than fresh tensors.
Output rows past ``query_start_loc_cpu[-1]`` (padding tokens) are left unwritten.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tracevllm.attention.backends.abstract import AttentionBackend, AttentionImpl, AttentionMetadata
from tracevllm.attention.ops.cpu_amx_decode import amx_decode_attention
from tracevllm.attention.ops.cpu_amx_prefill import prefill_attention
from tracevllm.attention.ops.cpu_paged_decode import paged_decode_attention


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
class _DecodeBucket:
    """Decode rows attended in one SDPA call: their query rows, the cache slots of their (padded)
    ``span`` keys each, and the mask of the keys each may see."""

    tokens: torch.Tensor  # [n] int64
    slots: torch.Tensor  # [n * span] int64
    mask: torch.Tensor  # [n, 1, 1, span] bool
    span: int


@dataclass(slots=True)
class _StepRows:
    """What every layer of a step reads alike from the metadata: the rows that decode, the rows that
    prefill, and whether every token has a cache slot (slot -1 marks a padding token)."""

    decode: np.ndarray
    prefill: list[int]
    all_slotted: bool


class TorchAttentionImpl(AttentionImpl):
    # Optimisation "decode_plan": share a step's rows and decode buckets across layers (_step_rows, _decode_plan).
    share_plan = False
    # Optimisation "cpu_paged_decode": decode rows attend in one C++ op that reads K/V in place (_decode_in_place).
    decode_in_place = False
    # Optimisation "cpu_amx_decode": that op's products on AMX tiles, where the cache is bf16 in blocks of 16k.
    decode_on_amx = False
    # Optimisations "cpu_amx_prefill" and "cpu_vec_prefill": prefill rows attend in one C++ op that reads K/V
    # in place (_prefill_in_place), with its products on AMX tiles (prefill_on_amx) or AVX512-BF16 dot products.
    prefill_in_place = False
    prefill_on_amx = False

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        key_cache, value_cache = kv_cache
        block_size = key_cache.shape[1]
        flat_k = key_cache.view(-1, self.num_kv_heads, self.head_dim)  # [num_slots, kv_heads, D]
        flat_v = value_cache.view(-1, self.num_kv_heads, self.head_dim)
        rows = self._step_rows(attn_metadata)
        self._write_kv(key, value, flat_k, flat_v, attn_metadata.slot_mapping, rows.all_slotted)

        output = torch.empty_like(query)
        if len(rows.decode) and self.decode_in_place:
            self._decode_in_place(query, key_cache, value_cache, attn_metadata, rows.decode, output)
        elif len(rows.decode):
            self._decode(query, flat_k, flat_v, block_size, attn_metadata, rows.decode, output)
        if rows.prefill and self.prefill_in_place:
            self._prefill_in_place(query, key_cache, value_cache, attn_metadata, rows.prefill, output)
        else:
            for row in rows.prefill:
                self._prefill(query, key, value, flat_k, flat_v, block_size, attn_metadata, row, output)
        return output

    def _step_rows(self, md: AttentionMetadata) -> _StepRows:
        """The step's decode and prefill rows and its padding check; with ``share_plan`` (optimisation
        "decode_plan") worked out by the first layer and kept in ``md.plan_cache`` for the others."""
        if self.share_plan and "rows" in md.plan_cache:
            return md.plan_cache["rows"]
        query_lens = np.diff(md.query_start_loc_cpu)
        rows = _StepRows(np.flatnonzero(query_lens == 1), np.flatnonzero(query_lens > 1).tolist(),
                         bool((md.slot_mapping >= 0).all()))
        if self.share_plan:
            md.plan_cache["rows"] = rows
        return rows

    @staticmethod
    def _write_kv(key, value, flat_k, flat_v, slot_mapping: torch.Tensor, all_slotted: bool) -> None:
        n = slot_mapping.shape[0]
        key, value = key[:n], value[:n]
        if not all_slotted:
            keep = slot_mapping >= 0  # slot -1: a padding token, never written
            slot_mapping, key, value = slot_mapping[keep], key[keep], value[keep]
        flat_k.index_copy_(0, slot_mapping, key)
        flat_v.index_copy_(0, slot_mapping, value)

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

    def _decode(self, query, flat_k, flat_v, block_size: int, md: AttentionMetadata,
                rows: np.ndarray, output: torch.Tensor) -> None:
        for bucket in self._decode_plan(md, block_size, rows):
            n, span = len(bucket.tokens), bucket.span
            k, v = self._gather(flat_k, flat_v, bucket.slots)
            k = k.view(n, span, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(n, span, self.num_kv_heads, self.head_dim).transpose(1, 2)
            group = self.num_heads // self.num_kv_heads
            q = query.index_select(0, bucket.tokens).view(n, self.num_kv_heads, group, self.head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bucket.mask, scale=self.scale)
            output.index_copy_(0, bucket.tokens, out.reshape(n, self.num_heads, self.head_dim))

    def _decode_in_place(self, query, key_cache, value_cache, md: AttentionMetadata, rows: np.ndarray,
                         output: torch.Tensor) -> None:
        """Optimisation "cpu_paged_decode": every decode row in one call of the C++ op, which reads each
        row's keys and values where they lie in the cache: no gather, no buckets, no mask. With
        "cpu_amx_decode", its AMX twin takes the call where it can (bf16, blocks a multiple of 16)."""
        if self.share_plan and "decode_rows" in md.plan_cache:
            rows_t, tokens = md.plan_cache["decode_rows"]
        else:
            rows_t = torch.from_numpy(rows).to(torch.long)
            tokens = torch.from_numpy(md.query_start_loc_cpu[rows]).to(torch.long)
            if self.share_plan:
                md.plan_cache["decode_rows"] = rows_t, tokens
        on_amx = self.decode_on_amx and key_cache.dtype == torch.bfloat16 and key_cache.shape[1] % 16 == 0
        (amx_decode_attention if on_amx else paged_decode_attention)(
            output, query, key_cache, value_cache, md.block_table, md.seq_lens, rows_t, tokens, self.scale,
            self.sliding_window)

    def _prefill_in_place(self, query, key_cache, value_cache, md: AttentionMetadata, rows: list[int],
                          output: torch.Tensor) -> None:
        """Optimisations "cpu_amx_prefill" and "cpu_vec_prefill": every prefill row in one call of the C++
        op, which reads the rows' keys and values (context and this step's, already written) from the cache."""
        if self.share_plan and "prefill_rows" in md.plan_cache:
            rows_t = md.plan_cache["prefill_rows"]
        else:
            rows_t = torch.tensor(rows, dtype=torch.long)
            if self.share_plan:
                md.plan_cache["prefill_rows"] = rows_t
        prefill_attention(output, query, key_cache, value_cache, md.block_table, md.query_start_loc, md.seq_lens,
                          rows_t, self.scale, self.sliding_window, amx=self.prefill_on_amx)

    def _decode_plan(self, md: AttentionMetadata, block_size: int, rows: np.ndarray) -> list[_DecodeBucket]:
        """The decode rows cut into buckets of similar span, each with its cache slots and mask.

        They depend only on the step's metadata and this layer's window, so with ``share_plan``
        (optimisation "decode_plan") the first layer stores them in ``md.plan_cache`` and every
        layer with the same window reuses them."""
        key = ("decode", self.sliding_window, block_size)
        if self.share_plan and key in md.plan_cache:
            return md.plan_cache[key]
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
        if self.share_plan:
            md.plan_cache[key] = buckets
        return buckets

    def _decode_bucket(self, md: AttentionMetadata, block_size: int, rows: np.ndarray, span: int) -> _DecodeBucket:
        device = md.seq_lens.device
        rows_t = torch.from_numpy(rows).to(device)
        tokens = torch.from_numpy(md.query_start_loc_cpu[rows]).to(device, torch.long)
        q_pos = md.seq_lens[rows_t].long().unsqueeze(1) - 1  # [n, 1]: each row's query position
        k_pos = (q_pos - (span - 1)).clamp(min=0) + torch.arange(span, device=device)  # [n, span]
        slots = self._slots(md.block_table[rows_t], torch.minimum(k_pos, q_pos), block_size)
        mask = self._allowed(q_pos, k_pos).view(len(rows), 1, 1, span)
        return _DecodeBucket(tokens, slots.flatten(), mask, span)

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
