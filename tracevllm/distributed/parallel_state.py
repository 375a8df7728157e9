"""Process groups for tensor and pipeline parallelism, the tensor-parallel collectives, and the
point-to-point sends between pipeline stages.

One process per rank; ``world_size = tensor_parallel_size x pipeline_parallel_size``. Ranks are laid
out as in vLLM, ``rank = pp_rank * tp_size + tp_rank``: a pipeline stage is a run of consecutive
ranks (one machine's GPUs, where the all-reduces are), and a pipeline joins the ranks that hold the
same slice in every stage::

    tp=2, pp=2     rank:      0  1  2  3
                   TP groups: [0, 1] [2, 3]    (stage 0, stage 1)
                   PP groups: [0, 2] [1, 3]    (tp rank 0's pipeline, tp rank 1's)

Layers ask ``get_tensor_model_parallel_rank()`` / ``_world_size()`` and call the two collectives
instead of assuming one device, so the models are the same code at every tp. Until
``initialize_model_parallel`` runs (and always at world size 1) both groups hold this process alone:
the collectives are the identity and torch.distributed is never touched. Along a PP group, each
stage but the last sends its intermediate tensors to the next (``isend_to_next`` / ``recv_from_prev``;
the model runner drives them).

``COMM_CLOCK`` adds up the seconds this process spends in each kind of communication; a Worker reads
it around ``execute_model`` for its step's record (the trace's ``worker.execute_model``).

Order of calls in a worker process: ``init_distributed_environment`` (joins the world: every rank
must call it with the same ``distributed_init_method``), then ``initialize_model_parallel`` (every
rank, the same sizes), then build the model.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class CommClock:
    """Seconds spent since the process started: waiting for the previous pipeline stage
    (``recv_s``), sending to the next (``send_s``), in tensor-parallel all-reduces and gathers
    (``collective_s``). On CUDA, NCCL calls return once queued, so this is their launch time."""

    recv_s: float = 0.0
    send_s: float = 0.0
    collective_s: float = 0.0

    @contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, kind, getattr(self, kind) + time.perf_counter() - start)


COMM_CLOCK = CommClock()


@dataclass(frozen=True)
class GroupCoordinator:
    """One process group as this rank sees it (vLLM's name): the global ranks in it, in group order,
    and this rank's index among them. ``device_group`` is None for a group of this process alone."""

    ranks: tuple[int, ...] = (0,)
    rank_in_group: int = 0
    device_group: dist.ProcessGroup | None = None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the group, in place (every rank gets the same result)."""
        if self.world_size == 1:
            return x
        with COMM_CLOCK.timing("collective_s"):
            dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim``, in group order, on every rank."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        with COMM_CLOCK.timing("collective_s"):
            dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    # ---- point to point, between consecutive pipeline stages -----------------------------------

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    def isend_to_next(self, x: torch.Tensor) -> dist.Work:
        """Start sending ``x`` to the next rank of the group and return at once: ``x`` must stay
        alive and unchanged until the returned ``Work`` is waited for. (gloo: a background thread
        writes the bytes; NCCL: the send is queued on NCCL's stream.)"""
        assert not self.is_last_rank, "the last rank has no next rank"
        assert x.is_contiguous()
        with COMM_CLOCK.timing("send_s"):
            return dist.isend(x, dst=self.ranks[self.rank_in_group + 1], group=self.device_group)

    def recv_from_prev(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Wait for the tensor the previous rank of the group sends next (its shape and dtype known
        on both sides, so nothing but the data crosses)."""
        assert not self.is_first_rank, "the first rank has no previous rank"
        x = torch.empty(shape, dtype=dtype, device=device)
        with COMM_CLOCK.timing("recv_s"):
            dist.recv(x, src=self.ranks[self.rank_in_group - 1], group=self.device_group)
        return x


_TP = GroupCoordinator()
_PP = GroupCoordinator()


def get_tp_group() -> GroupCoordinator:
    return _TP


def get_pp_group() -> GroupCoordinator:
    return _PP


def get_tensor_model_parallel_rank() -> int:
    return _TP.rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return _TP.world_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return _TP.all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _TP.all_gather(x, dim)


def init_distributed_environment(world_size: int, rank: int, distributed_init_method: str,
                                 local_rank: int, backend: str) -> None:
    """Join the world of ``world_size`` processes as ``rank``: ``backend`` "gloo" on CPU, "nccl" on
    CUDA, where ``local_rank`` (this rank's index on its machine) is the GPU it uses.
    ``distributed_init_method`` is ``tcp://host:port`` of rank 0's rendezvous, the same on every
    rank (``get_distributed_init_method``). Blocks until every rank has joined; a process that has
    joined already (a second Worker in it) stays in its world."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # NCCL runs on the current device
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(f"this process is already rank {dist.get_rank()} of {dist.get_world_size()}, "
                               f"not rank {rank} of {world_size}")
        return
    dist.init_process_group(backend, init_method=distributed_init_method, world_size=world_size, rank=rank)


def model_parallel_group_ranks(tp_size: int, pp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(TP groups, PP groups) as lists of global ranks, laid out as the module docstring draws."""
    world_size = tp_size * pp_size
    tp_groups = [list(range(stage * tp_size, (stage + 1) * tp_size)) for stage in range(pp_size)]
    pp_groups = [list(range(tp_rank, world_size, tp_size)) for tp_rank in range(tp_size)]
    return tp_groups, pp_groups


def initialize_model_parallel(tensor_model_parallel_size: int, pipeline_model_parallel_size: int) -> None:
    """Create the TP and PP groups of the world ``init_distributed_environment`` joined, and keep the
    two this rank belongs to. Every rank must call it: ``dist.new_group`` is collective, so each
    rank creates every group, its own or not, in the same order."""
    global _TP, _PP
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size != tensor_model_parallel_size * pipeline_model_parallel_size:
        raise RuntimeError(f"world size {world_size} is not tensor_parallel_size {tensor_model_parallel_size} "
                           f"x pipeline_parallel_size {pipeline_model_parallel_size}")
    tp_groups, pp_groups = model_parallel_group_ranks(tensor_model_parallel_size, pipeline_model_parallel_size)
    _TP = _new_groups(tp_groups, rank)
    _PP = _new_groups(pp_groups, rank)


def _new_groups(groups: list[list[int]], rank: int) -> GroupCoordinator:
    """Create every group of ``groups`` (with the world's backend); return the one holding ``rank``."""
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks, backend=dist.get_backend())
        if rank in ranks:
            mine = GroupCoordinator(tuple(ranks), ranks.index(rank), group)
    assert mine is not None
    return mine


def get_distributed_init_method(ip: str, port: int) -> str:
    """The ``tcp://`` address every rank passes to ``init_distributed_environment`` (an IPv6
    address in brackets)."""
    try:
        is_v6 = ipaddress.ip_address(ip).version == 6
    except ValueError:  # a host name
        is_v6 = False
    return f"tcp://[{ip}]:{port}" if is_v6 else f"tcp://{ip}:{port}"


def get_open_port() -> int:
    """A TCP port the OS says is free now, for rank 0's rendezvous. Nothing holds it until rank 0
    binds it, so another process may take it in between (rare; vLLM takes the same chance)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
