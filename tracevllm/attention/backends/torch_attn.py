"""The plain-PyTorch paged attention backend: the reference path, and the fast one on CPU.

Per layer and step: write the step's K/V rows into the paged cache at ``slot_mapping``, then
attend. Work is planned on the host copies of the metadata, so no device sync is needed:

* decode rows (query_len 1) are batched into ONE ``scaled_dot_product_attention``. Their blocks are
  gathered through the block table into ``[n, L, kv_heads, D]`` (L = the longest context, shorter
  ones masked), and the query heads sharing a KV head are folded into query rows, so K and V are
  never repeated per query head::

      q    [n, kv_heads, group, D]   x   K [n, kv_heads, L, D]   ->   [n, kv_heads, group, D]

* prefill rows (query_len > 1) run one SDPA each: with no cached context straight on the fresh
  K/V (``is_causal``); with a cached prefix, on keys gathered from the cache, under a causal mask
  shifted by the context length (query row i sits at position ``context_len + i``).

Sliding window (Mistral, Qwen2): a key at distance >= ``sliding_window`` from the query is masked,
as in Hugging Face transformers.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tracevllm.attention.backends.abstract import AttentionBackend, AttentionImpl, AttentionMetadata


class TorchAttentionImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata: AttentionMetadata) -> torch.Tensor:
        key_cache, value_cache = kv_cache
        self._write_kv(key, value, key_cache, value_cache, attn_metadata.slot_mapping)
        output = torch.empty_like(query)
        q_start = attn_metadata.query_start_loc_cpu
        q_lens = np.diff(q_start)
        decode_rows = np.nonzero(q_lens == 1)[0]
        if len(decode_rows):
            self._decode(query, key_cache, value_cache, attn_metadata, decode_rows, output)
        for row in np.nonzero(q_lens > 1)[0].tolist():
            self._prefill(query, key, value, key_cache, value_cache, attn_metadata, row, output)
        return output

    def _write_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        n = slot_mapping.shape[0]
        flat_k = key_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_v = value_cache.view(-1, self.num_kv_heads, self.head_dim)
        valid = slot_mapping >= 0  # -1 marks padding, which is never written
        if bool(valid.all()):
            flat_k.index_copy_(0, slot_mapping, key[:n])
            flat_v.index_copy_(0, slot_mapping, value[:n])
        else:
            flat_k[slot_mapping[valid]] = key[:n][valid]
            flat_v[slot_mapping[valid]] = value[:n][valid]

    def _gather(self, cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
        """``[..., num_blocks]`` block ids -> ``[..., length, kv_heads, D]`` keys or values."""
        blocks = cache[block_ids]  # [..., num_blocks, block_size, kv_heads, D]
        shape = blocks.shape
        return blocks.reshape(*shape[:-4], shape[-4] * shape[-3], *shape[-2:])[..., :length, :, :]

    def _causal_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Keys at or before the query's position (and within the sliding window, if any)."""
        allowed = k_pos <= q_pos
        if self.sliding_window is not None:
            allowed = allowed & (q_pos - k_pos < self.sliding_window)
        return allowed

    def _decode(self, query, key_cache, value_cache, md: AttentionMetadata, rows: np.ndarray, output) -> None:
        n, group = len(rows), self.num_heads // self.num_kv_heads
        seq_lens = md.seq_lens_cpu[rows]
        max_len = int(seq_lens.max())
        block_size = key_cache.shape[1]
        rows_t = torch.from_numpy(rows).to(query.device)
        token_idx = torch.from_numpy(md.query_start_loc_cpu[rows]).to(query.device, torch.long)
        block_ids = md.block_table[rows_t, : -(-max_len // block_size)].long()
        k = self._gather(key_cache, block_ids, max_len).transpose(1, 2)  # [n, kv_heads, L, D]
        v = self._gather(value_cache, block_ids, max_len).transpose(1, 2)
        q = query[token_idx].view(n, self.num_kv_heads, group, self.head_dim)
        lens = torch.from_numpy(seq_lens).to(query.device).view(n, 1, 1, 1)
        k_pos = torch.arange(max_len, device=query.device).view(1, 1, 1, max_len)
        mask = self._causal_mask(lens - 1, k_pos)  # also hides the padding past each row's end
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        output[token_idx] = out.reshape(n, self.num_heads, self.head_dim)

    def _prefill(self, query, key, value, key_cache, value_cache, md: AttentionMetadata, row: int, output) -> None:
        start, end = int(md.query_start_loc_cpu[row]), int(md.query_start_loc_cpu[row + 1])
        q_len, seq_len = end - start, int(md.seq_lens_cpu[row])
        context_len = seq_len - q_len
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, D]
        if context_len == 0:
            k, v = key[start:end], value[start:end]
        else:
            block_ids = md.block_table[row, : -(-seq_len // key_cache.shape[1])].long()
            k = self._gather(key_cache, block_ids, seq_len)
            v = self._gather(value_cache, block_ids, seq_len)
        k, v = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)  # [1, kv_heads, L, D]
        if context_len == 0 and self.sliding_window is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            q_pos = torch.arange(context_len, seq_len, device=query.device).view(-1, 1)
            k_pos = torch.arange(seq_len, device=query.device).view(1, -1)
            mask = self._causal_mask(q_pos, k_pos)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
        output[start:end] = out.squeeze(0).transpose(0, 1)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TorchAttentionImpl
