"""Choose the attention backend by name."""

from __future__ import annotations

import torch

from tracevllm.attention.backends.abstract import AttentionBackend
from tracevllm.attention.backends.torch_attn import TorchAttentionBackend

_BACKENDS: dict[str, type[AttentionBackend]] = {TorchAttentionBackend.name: TorchAttentionBackend}


def get_attn_backend(name: str | None, device: torch.device) -> type[AttentionBackend]:
    """``None`` or ``"auto"`` picks the default for the device (the torch backend, for now)."""
    if name in (None, "auto"):
        name = "torch"
    backend = _BACKENDS.get(name)
    if backend is None:
        raise ValueError(f"attention_backend must be one of {['auto', *_BACKENDS]}, got {name!r}.")
    return backend
