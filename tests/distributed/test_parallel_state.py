"""parallel_state: the rank layout, the rendezvous address, and real TP and PP groups over gloo.

The group test starts 4 processes (tp=2 x pp=2), each joining the world and all-reducing and
all-gathering over its two groups: every rank must land in the groups the layout draws.
"""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch

from tracevllm.distributed import parallel_state
from tracevllm.distributed.parallel_state import (
    get_distributed_init_method,
    get_open_port,
    model_parallel_group_ranks,
)


@pytest.mark.parametrize("tp, pp, tp_groups, pp_groups", [
    (2, 2, [[0, 1], [2, 3]], [[0, 2], [1, 3]]),
    (4, 1, [[0, 1, 2, 3]], [[0], [1], [2], [3]]),
    (1, 3, [[0], [1], [2]], [[0, 1, 2]]),
    (3, 2, [[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]]),
])
def test_rank_is_pp_rank_times_tp_plus_tp_rank(tp, pp, tp_groups, pp_groups):
    assert model_parallel_group_ranks(tp, pp) == (tp_groups, pp_groups)


def test_init_method_and_open_port():
    assert get_distributed_init_method("127.0.0.1", 29500) == "tcp://127.0.0.1:29500"
    assert get_distributed_init_method("::1", 29500) == "tcp://[::1]:29500"
    assert get_distributed_init_method("node-0", 29500) == "tcp://node-0:29500"
    port = get_open_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free indeed


def test_world_size_one_touches_no_torch_distributed():
    x = torch.ones(3)
    assert parallel_state.get_tensor_model_parallel_world_size() == 1
    assert parallel_state.tensor_model_parallel_all_reduce(x) is x
    assert parallel_state.tensor_model_parallel_all_gather(x) is x
    assert not torch.distributed.is_initialized()


def _group_rank_main(rank: int, world_size: int, init_method: str, results) -> None:
    torch.set_num_threads(1)
    parallel_state.init_distributed_environment(world_size, rank, init_method, rank, "gloo")
    parallel_state.initialize_model_parallel(2, 2)
    tp, pp = parallel_state.get_tp_group(), parallel_state.get_pp_group()
    results.put((rank, tp.ranks, tp.rank_in_group, pp.ranks, pp.rank_in_group,
                 tp.all_reduce(torch.tensor([float(rank)])).item(),
                 pp.all_gather(torch.tensor([[float(rank)]]), dim=0).flatten().tolist()))
    torch.distributed.destroy_process_group()


def test_tp_and_pp_groups_over_gloo():
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    init_method = get_distributed_init_method("127.0.0.1", get_open_port())
    procs = [ctx.Process(target=_group_rank_main, args=(rank, 4, init_method, results), daemon=True)
             for rank in range(4)]
    for proc in procs:
        proc.start()
    try:
        got = sorted(results.get(timeout=60) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    assert got == [
        # rank, TP group, rank in it, PP group, rank in it, sum over TP, gathered over PP
        (0, (0, 1), 0, (0, 2), 0, 1.0, [0.0, 2.0]),
        (1, (0, 1), 1, (1, 3), 0, 1.0, [1.0, 3.0]),
        (2, (2, 3), 0, (0, 2), 1, 5.0, [0.0, 2.0]),
        (3, (2, 3), 1, (1, 3), 1, 5.0, [1.0, 3.0]),
    ]
