"""Tiny random-weight Llama / Mistral / Qwen2 / Qwen3 checkpoints, built and saved by transformers itself.

Each has 2 layers, hidden size 64, 4 query heads sharing 2 KV heads, and the bundled SmolLM2
tokenizer (vocab 49152). Between them they cover what the loaders and models must handle:

    llama    llama3 RoPE scaling, tied embeddings (no lm_head.weight in the checkpoint)
    mistral  MistralForCausalLM, a sliding window of 6 tokens on every layer
    qwen2    q/k/v bias, untied lm_head, saved in several safetensors shards (with an index)
    qwen3    q/k RMSNorm per head, head_dim 32 (not hidden / heads), untied lm_head

Weights are drawn with a larger spread than the usual init (biases and norm weights included, so they
are not trivially 0 or 1) so the logits are far from uniform and greedy decoding has clear winners:
a near-tie would make "same tokens as transformers" a test of float rounding rather than of the engine.
"""

from __future__ import annotations

import os
import shutil

import torch

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
_COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
               rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
_SEEDS = {"llama": 1, "qwen2": 2, "qwen3": 3, "mistral": 4}


def _config(arch: str, overrides: dict):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if arch == "llama":
        return LlamaConfig(**{**_COMMON, "tie_word_embeddings": True, "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **overrides})
    if arch == "mistral":
        return MistralConfig(**{**_COMMON, "tie_word_embeddings": False, "sliding_window": 6,
                                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **overrides})
    if arch == "qwen2":
        return Qwen2Config(**{**_COMMON, "tie_word_embeddings": False,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **overrides})
    if arch == "qwen3":
        return Qwen3Config(**{**_COMMON, "head_dim": 32, "tie_word_embeddings": False,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, **overrides})
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def make_tiny_checkpoint(arch: str, path, tokenizer_dir: str | None = None, **overrides) -> str:
    """Save a tiny ``arch`` checkpoint (config fields replaced by ``overrides``) into ``path``, with the
    tokenizer files of ``tokenizer_dir`` (default: the bundled model's); returns ``path``."""
    from transformers import AutoModelForCausalLM

    from tracevllm.models.loader import resolve_model

    torch.manual_seed(_SEEDS[arch])
    model = AutoModelForCausalLM.from_config(_config(arch, overrides), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    path = str(path)
    # Sharded for qwen2, so that loading through model.safetensors.index.json is exercised.
    model.save_pretrained(path, safe_serialization=True, max_shard_size="2MB" if arch == "qwen2" else "1GB")
    tokenizer_dir = tokenizer_dir or resolve_model(None)
    for name in os.listdir(tokenizer_dir):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(os.path.join(tokenizer_dir, name), path)
    return path
