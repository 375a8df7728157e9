"""Choose the attention backend (``--attention-backend``): "cpu", "torch" or "triton", or "auto".

"torch" is the plain reference (SDPA on K/V gathered from the cache); "cpu" runs the same idea on
this CPU's C++ ops and decides at start-up which (``backends/cpu_attn.py``); "triton" is the GPU
path. vLLM: ``vllm/v1/attention/selector.py``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:  # the backends import torch; engine/arg_utils.py reads BACKEND_NAMES for the CLI without it
    import torch

    from tracevllm.attention.backends.abstract import AttentionBackend
    from tracevllm.optimizations import OptimizationConfig

AttentionBackendName = Literal["auto", "cpu", "torch", "triton"]
BACKEND_NAMES: tuple[str, ...] = get_args(AttentionBackendName)


def get_attn_backend(name: str | None, device: torch.device,
                     optimization_config: OptimizationConfig | None = None) -> type[AttentionBackend]:
    """``None`` or ``"auto"``: "triton" on CUDA (if triton imports, else "torch"); on a CPU, "cpu" while
    any of its optimisations is on in ``optimization_config`` (default: ``OptimizationConfig.from_names()``),
    else "torch", so that turning them all off gives the plain path.

    "cpu" runs only on a CPU. "triton" on a CPU needs Triton's interpreter, which reads
    ``TRITON_INTERPRET=1`` from the environment when triton is first imported: ValueError otherwise
    (or if triton is missing)."""
    if name not in (None, *BACKEND_NAMES):
        raise ValueError(f"attention_backend must be one of {list(BACKEND_NAMES)}, got {name!r}")
    from tracevllm.attention.backends.cpu_attn import CPUAttentionBackend
    from tracevllm.attention.backends.torch_attn import TorchAttentionBackend
    from tracevllm.optimizations import OptimizationConfig

    if name in (None, "auto"):
        if device.type == "cuda":
            try:
                return _triton_backend()
            except ImportError:
                return TorchAttentionBackend
        config = optimization_config or OptimizationConfig.from_names()
        on = any(config.enabled(switch) for switch in CPUAttentionBackend.optimizations)
        return CPUAttentionBackend if device.type == "cpu" and on else TorchAttentionBackend
    if name == "torch":
        return TorchAttentionBackend
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"attention_backend 'cpu' runs on a CPU, not on device {device.type!r}.")
        return CPUAttentionBackend
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"attention_backend 'triton' on device {device.type!r} runs only under Triton's interpreter: "
            "set TRITON_INTERPRET=1 in the environment before starting (or use a CUDA device)."
        )
    try:
        return _triton_backend()
    except ImportError as e:
        raise ValueError(f"attention_backend 'triton' needs the triton package (pip install triton): {e}") from e


def _triton_backend() -> type[AttentionBackend]:
    from tracevllm.attention.backends.triton_attn import TritonAttentionBackend

    return TritonAttentionBackend
