"""Qwen2 / Qwen2.5: Llama with a bias on the q, k and v projections (always; none on o_proj).

Sliding-window layers follow ``layer_types`` (``use_sliding_window`` and ``max_window_layers`` in
older configs); see ``sliding_window_for_layer``.
"""

from __future__ import annotations

from tracevllm.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    @staticmethod
    def projection_biases(config) -> tuple[bool, bool]:
        return True, False


class Qwen2ForCausalLM(LlamaForCausalLM):
    attention_cls = Qwen2Attention
