"""The tensor-parallel group: this process's rank, the group size, and its two collectives.

Layers ask these functions instead of assuming one device, so starting one worker per rank later
changes this file and the executor, not the models. With world size 1 the collectives are identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_WORLD_SIZE = 1


def init_tensor_model_parallel(rank: int, world_size: int) -> None:
    """Record this process's place in the group (torch.distributed must already be initialised)."""
    global _TP_RANK, _TP_WORLD_SIZE
    _TP_RANK, _TP_WORLD_SIZE = rank, world_size


def get_tensor_model_parallel_rank() -> int:
    return _TP_RANK


def get_tensor_model_parallel_world_size() -> int:
    return _TP_WORLD_SIZE


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP_WORLD_SIZE == 1:
        return x
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if _TP_WORLD_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_WORLD_SIZE)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)
