"""The Triton paged attention backend: two kernels per layer and step, whatever the batch holds.

1. ``reshape_and_cache`` writes the step's K/V rows into the paged cache at ``slot_mapping``.
2. ``unified_attention`` attends every query row of the batch (decode, prefill, chunked prefill over
   a cached prefix) in one launch, reading K/V through the block table; decode batches of few long
   sequences take its split-KV path. See ``attention/ops/`` for the tile layout.

Same metadata and cache layout as the torch backend. On CPU it runs only under Triton's interpreter
(``TRITON_INTERPRET=1``, set before triton is first imported): that is how the tests check it.
"""

from __future__ import annotations

import torch

from tracevllm.attention.backends.abstract import AttentionBackend, AttentionImpl, AttentionMetadata
from tracevllm.attention.ops.triton_reshape_and_cache import reshape_and_cache
from tracevllm.attention.ops.triton_unified_attention import unified_attention


class TritonAttentionImpl(AttentionImpl):
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        key_cache, value_cache = kv_cache
        md = attn_metadata
        reshape_and_cache(key, value, key_cache, value_cache, md.slot_mapping)
        output = torch.empty_like(query)
        unified_attention(
            query, key_cache, value_cache, output, md.query_start_loc, md.seq_lens, md.block_table,
            num_actual_tokens=md.num_actual_tokens, max_query_len=md.max_query_len,
            max_seq_len=md.max_seq_len, scale=self.scale, sliding_window=self.sliding_window,
        )
        return output


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graphs = True

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TritonAttentionImpl
