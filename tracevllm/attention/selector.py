"""Choose the attention backend by name (``--attention-backend``): "torch" or "triton"."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the backends import torch; config.py reads BACKEND_NAMES for the CLI without it
    import torch

    from tracevllm.attention.backends.abstract import AttentionBackend

BACKEND_NAMES = ("auto", "torch", "triton")


def get_attn_backend(name: str | None, device: torch.device) -> type[AttentionBackend]:
    """``None`` or ``"auto"``: "triton" on CUDA (if triton imports), "torch" elsewhere.

    "triton" on a CPU needs Triton's interpreter, which reads ``TRITON_INTERPRET=1`` from the
    environment when triton is first imported: ValueError otherwise (or if triton is missing)."""
    if name not in (None, *BACKEND_NAMES):
        raise ValueError(f"attention_backend must be one of {list(BACKEND_NAMES)}, got {name!r}")
    from tracevllm.attention.backends.torch_attn import TorchAttentionBackend

    if name in (None, "auto"):
        if device.type != "cuda":
            return TorchAttentionBackend
        try:
            return _triton_backend()
        except ImportError:
            return TorchAttentionBackend
    if name == "torch":
        return TorchAttentionBackend
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
