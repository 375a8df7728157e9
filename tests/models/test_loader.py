"""Model resolution, dtype choice and weight loading errors."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tracevllm.models.loader import iterate_safetensors, resolve_dtype, resolve_model
from tracevllm.models.registry import get_model_cls


class Cfg:
    def __init__(self, dtype):
        self.dtype = dtype


def test_resolve_model_errors(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not found"):
        resolve_model(str(tmp_path))  # a directory without config.json
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="safetensors"):
        list(iterate_safetensors(str(tmp_path)))


def test_unsupported_architecture_is_named():
    with pytest.raises(ValueError, match="FooForCausalLM"):
        get_model_cls(["FooForCausalLM"])
    assert get_model_cls(["MistralForCausalLM"]).__name__ == "LlamaForCausalLM"


def test_resolve_dtype():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", Cfg(torch.float32), cpu) == torch.float32
    assert resolve_dtype("auto", Cfg(torch.float32), cuda) == torch.bfloat16
    assert resolve_dtype("auto", Cfg("bfloat16"), cpu) == torch.bfloat16
    assert resolve_dtype("half", Cfg(torch.float32), cpu) == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", Cfg(torch.float32), cpu)


def test_bundled_model_converted_once(bundled_model_dir):
    assert resolve_model("smollm2") == bundled_model_dir == resolve_model(None)
    names = os.listdir(bundled_model_dir)
    assert "config.json" in names and any(n.endswith(".safetensors") for n in names)
    config = json.load(open(os.path.join(bundled_model_dir, "config.json")))
    assert "quantization_config" not in config
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(bundled_model_dir, local_files_only=True).chat_template


def test_mismatched_checkpoint_is_a_value_error(tiny_checkpoint, tmp_path):
    from safetensors.torch import save_file

    from tracevllm.attention.backends.torch_attn import TorchAttentionBackend
    from tracevllm.models.loader import load_model

    src = tiny_checkpoint("qwen3")
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            os.symlink(os.path.join(src, name), tmp_path / name)
    tensors = dict(iterate_safetensors(src))
    tensors["model.layers.0.self_attn.extra.weight"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="extra"):
        load_model(str(tmp_path), torch.float32, torch.device("cpu"), TorchAttentionBackend)
    del tensors["model.layers.0.self_attn.extra.weight"], tensors["model.norm.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        load_model(str(tmp_path), torch.float32, torch.device("cpu"), TorchAttentionBackend)
