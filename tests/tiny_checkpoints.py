"""Tiny random-weight Llama / Qwen2 / Qwen3 checkpoints, built by transformers itself.

Weights are drawn with a larger spread than the usual init so the logits are far from uniform and
greedy decoding has clear winners (a near-tie would make "same tokens as transformers" a test of
float rounding rather than of the engine).
"""

from __future__ import annotations

import os
import shutil

import torch

_COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
               rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)


def _config(arch: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if arch == "llama":
        return LlamaConfig(**_COMMON, tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if arch == "qwen2":
        return Qwen2Config(**_COMMON, tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 10000.0})
    if arch == "qwen3":
        return Qwen3Config(**_COMMON, head_dim=32, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    raise ValueError(f"unknown tiny arch {arch!r}")


def make_tiny_checkpoint(arch: str, path, tokenizer_dir: str) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3}[arch])
    model = AutoModelForCausalLM.from_config(_config(arch), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)  # biases (Qwen2's q/k/v) too: non-trivial values
    path = str(path)
    # Sharded for qwen2, so that loading through model.safetensors.index.json is exercised.
    model.save_pretrained(path, safe_serialization=True, max_shard_size="2MB" if arch == "qwen2" else "1GB")
    for name in os.listdir(tokenizer_dir):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(os.path.join(tokenizer_dir, name), path)
    return path
