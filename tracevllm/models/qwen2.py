"""Qwen2 / Qwen2.5: Llama with a bias on the q, k and v projections (none on o_proj)."""

from __future__ import annotations

from tracevllm.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    qkv_bias_default = True


class Qwen2ForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen2Attention
