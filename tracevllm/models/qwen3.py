"""Qwen3: Llama attention plus an RMSNorm over each query and key head, before RoPE."""

from __future__ import annotations

import torch

from tracevllm.layers.layernorm import RMSNorm
from tracevllm.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    def __init__(self, config, layer_idx: int, attn_backend) -> None:
        super().__init__(config, layer_idx, attn_backend)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = q.shape[0]
        q = self.q_norm(q.view(t, -1, self.head_dim)).view(t, -1)
        k = self.k_norm(k.view(t, -1, self.head_dim)).view(t, -1)
        return q, k


class Qwen3ForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen3Attention
