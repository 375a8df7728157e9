"""RayDistributedExecutor: one Ray actor per rank, on this machine or across a Ray cluster.

Ray (``pip install -e ".[ray]"``) places the ranks: a placement group reserves one bundle per rank
(a GPU on CUDA, a CPU core on CPU), packed onto as few machines as possible, so a stage's
tensor-parallel ranks share a machine when they fit. The executor connects to the cluster named by
``RAY_ADDRESS`` (``ray start --head`` on one machine, ``ray start --address=...`` on the others), or
starts a local one when there is none.

Each call is broadcast by putting its arguments in Ray's object store once (``ray.put``: shared
memory on each machine) and passing the reference to every actor, which is Ray's counterpart of
the multiprocess executor's shared-memory queue. Ranks rendezvous for torch.distributed at rank 0's
machine, on a port rank 0 picks there. A failed or dead actor surfaces as ``RuntimeError`` from
the call that waits on it, and the other actors are then killed.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any


from tracevllm.distributed.parallel_state import get_distributed_init_method
from tracevllm.executor.abstract import Executor

_PLACEMENT_TIMEOUT_S = 60.0


class RayWorkerWrapper:
    """The actor: holds one rank's Worker and runs the executor's calls on it."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.worker = None

    def get_node_ip_and_open_port(self) -> tuple[str, int]:
        import ray

        from tracevllm.distributed.parallel_state import get_open_port

        return ray.util.get_node_ip_address(), get_open_port()

    def get_pid(self) -> int:
        return os.getpid()

    def init_worker(self, vllm_config, local_rank: int, distributed_init_method: str) -> None:
        from tracevllm.utils import set_process_title
        from tracevllm.worker.gpu_worker import Worker

        set_process_title(f"Worker-{self.rank}")
        self.worker = Worker(vllm_config, rank=self.rank, local_rank=local_rank,
                             distributed_init_method=distributed_init_method)
        self.worker.load_model()

    def execute_method(self, method: str, args: tuple, unique_reply_rank: int | None) -> Any:
        result = getattr(self.worker, method)(*args)
        return result if unique_reply_rank is None or unique_reply_rank == self.rank else None


class RayDistributedExecutor(Executor):
    def _init_executor(self) -> None:
        try:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError:
            raise ValueError('distributed_executor_backend="ray" needs Ray: pip install -e ".[ray]"') from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
        on_gpu = self.vllm_config.device.type == "cuda"
        bundle = {"GPU": 1} if on_gpu else {"CPU": 1}
        self.placement_group = placement_group([bundle] * self.world_size, strategy="PACK")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=_PLACEMENT_TIMEOUT_S)
        if not ready:
            ray.util.remove_placement_group(self.placement_group)
            raise RuntimeError(
                f"Ray could not reserve {self.world_size} x {bundle} for the ranks within {_PLACEMENT_TIMEOUT_S:.0f} s; "
                f"the cluster has {ray.cluster_resources()}."
            )
        actor_class = ray.remote(RayWorkerWrapper)
        self.workers = [
            actor_class.options(
                num_gpus=1 if on_gpu else 0, num_cpus=0 if on_gpu else 1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=rank),
            ).remote(rank)
            for rank in range(self.world_size)
        ]
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="RayCalls")  # keeps call order
        self._error: RuntimeError | None = None
        self._lock = threading.Lock()
        try:
            ip_ports = self._get([w.get_node_ip_and_open_port.remote() for w in self.workers])
            rank0_ip, port = ip_ports[0]
            local_ranks = [sum(ip == other for other, _ in ip_ports[:rank]) for rank, (ip, _) in enumerate(ip_ports)]
            init_method = get_distributed_init_method(rank0_ip, port)
            self._get([w.init_worker.remote(self.vllm_config, local_ranks[rank], init_method)
                       for rank, w in enumerate(self.workers)])
        except BaseException:
            self.shutdown()
            raise

    def collective_rpc(
        self, method: str, args: tuple = (), unique_reply_rank: int | None = None, non_block: bool = False
    ) -> Any:
        if self._error is not None:
            raise self._error
        args_ref = self.ray.put(args)  # written once; every actor reads the same object
        refs = [w.execute_method.remote(method, args_ref, unique_reply_rank) for w in self.workers]

        def wait() -> Any:
            results = self._get(refs)
            return results if unique_reply_rank is None else results[unique_reply_rank]

        if not non_block:
            return wait()
        return self._calls.submit(wait)

    def _get(self, refs: list) -> list:
        """Every ref's result; the first failure (in whatever rank) raises at once."""
        ray = self.ray
        index = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done)
            except ray.exceptions.RayActorError:
                raise self._fail(f"Worker-{index[done[0]]} (a Ray actor) died.") from None
            except ray.exceptions.RayTaskError as e:
                raise self._fail(f"Worker-{index[done[0]]} failed:\n{e}") from None
        return ray.get(refs)

    def _fail(self, message: str) -> RuntimeError:
        self._error = RuntimeError(message)
        self.shutdown()
        return self._error

    def shutdown(self) -> None:
        """Kill the actors and free their reservation (the Ray cluster itself stays up)."""
        with self._lock:
            for worker in getattr(self, "workers", []):
                self.ray.kill(worker)
            self.workers = []
            if getattr(self, "placement_group", None) is not None:
                self.ray.util.remove_placement_group(self.placement_group)
                self.placement_group = None

