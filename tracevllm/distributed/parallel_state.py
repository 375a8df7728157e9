"""The tensor-parallel group: this process's rank, the group size, and its two collectives.

Layers ask these functions instead of assuming one device, so starting one worker per rank later
changes this file and the executor, not the models. With world size 1 (the default until
``init_tensor_model_parallel`` is called) the collectives are the identity and torch.distributed is
never touched.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_WORLD_SIZE = 1


def init_tensor_model_parallel(rank: int, world_size: int) -> None:
    """Record this process's place in the group. With ``world_size > 1``, torch.distributed must
    already be initialised with exactly these ranks (one process per rank)."""
    global _TP_RANK, _TP_WORLD_SIZE
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}) and world_size >= 1, got rank={rank}, "
                         f"world_size={world_size}.")
    _TP_RANK, _TP_WORLD_SIZE = rank, world_size


def get_tensor_model_parallel_rank() -> int:
    return _TP_RANK


def get_tensor_model_parallel_world_size() -> int:
    return _TP_WORLD_SIZE


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the ranks (in place when the group has more than one rank)."""
    if _TP_WORLD_SIZE == 1:
        return x
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim``, in rank order."""
    if _TP_WORLD_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_WORLD_SIZE)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)
