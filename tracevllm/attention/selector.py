"""Choose the attention backend by name (``--attention-backend``)."""

from __future__ import annotations

import torch

from tracevllm.attention.backends.abstract import AttentionBackend
from tracevllm.attention.backends.torch_attn import TorchAttentionBackend

_BACKENDS: dict[str, type[AttentionBackend]] = {TorchAttentionBackend.name: TorchAttentionBackend}


def get_attn_backend(name: str | None, device: torch.device) -> type[AttentionBackend]:
    """``None`` or ``"auto"`` picks the default for ``device``: "torch" everywhere for now (CUDA is
    to default to a Triton backend once one exists); any other name must be a registered backend."""
    if name is None or name == "auto":
        name = "torch"
    backend = _BACKENDS.get(name)
    if backend is None:
        raise ValueError(f"attention_backend must be one of {['auto', *_BACKENDS]}, got {name!r}")
    return backend
