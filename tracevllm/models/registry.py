"""Hugging Face architecture name -> our model class."""

from __future__ import annotations

from tracevllm.models.llama import LlamaForCausalLM
from tracevllm.models.qwen2 import Qwen2ForCausalLM
from tracevllm.models.qwen3 import Qwen3ForCausalLM

_MODELS = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_cls(architectures: list[str]) -> type:
    for arch in architectures:
        if arch in _MODELS:
            return _MODELS[arch]
    raise ValueError(
        f"Model architecture {architectures or '(none given)'} is not supported; "
        f"supported architectures: {sorted(_MODELS)}."
    )
