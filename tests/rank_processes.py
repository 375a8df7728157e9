"""``RankProcesses``: Workers as the ranks of one world, each in a spawned process (CPU, gloo).

A stand-in for a multi-process executor, small enough for tests: every call goes to every rank, in
the same order, over a pipe; a rank that fails sends its traceback, and a rank that does not answer
within ``timeout_s`` (a hang in a collective, a crash) fails the call instead of hanging the test.
The processes join the world once, at the first ``build``; later ``build`` calls replace each
rank's Worker (a new model, new groups) in the same world.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tracevllm.config import VllmConfig
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.distributed.parallel_state import get_distributed_init_method, get_open_port


@dataclass
class _Failure:
    rank: int
    traceback: str


def _rank_main(rank: int, distributed_init_method: str, conn) -> None:
    from tracevllm.worker.gpu_worker import Worker

    torch.set_num_threads(1)  # the ranks share this machine's cores
    worker = None
    while (message := conn.recv()) is not None:
        method, args = message
        try:
            if method == "build":
                worker = None  # the previous one's memory goes first
                worker = Worker(*args, rank=rank, local_rank=rank, distributed_init_method=distributed_init_method)
                result = None
            elif method == "step":
                result = worker.execute_model(*args), worker.sample_tokens()
            elif callable(method):
                result = method(worker, *args)
            else:
                result = getattr(worker, method)(*args)
        except Exception:
            result = _Failure(rank, traceback.format_exc())
        conn.send(result)


class RankProcesses:
    def __init__(self, world_size: int, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        init_method = get_distributed_init_method("127.0.0.1", get_open_port())
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        self.exitcodes: list[int | None] = []  # once closed
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(rank, init_method, child), daemon=True,
                               name=f"tp-rank-{rank}")
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def call(self, method: str | Callable, *args) -> list:
        """Every rank's result of ``worker.method(*args)``, or of ``method(worker, *args)`` for a
        module-level function, in rank order. If any rank fails or does not answer, every rank is
        stopped (one may be stuck in a collective) and RuntimeError says why."""
        if not self.procs:
            raise RuntimeError("the rank processes were stopped after an earlier failure")
        for conn in self.conns:
            conn.send((method, args))
        results = []
        for rank, conn in enumerate(self.conns):
            try:
                if not conn.poll(self.timeout_s):
                    raise TimeoutError(f"no answer within {self.timeout_s} s")
                results.append(conn.recv())
            except (EOFError, OSError) as e:  # a timeout, or the rank's process is gone (EOF, reset)
                self.close(kill=True)
                reason = e if isinstance(e, TimeoutError) else f"its process ended, exit code {self.exitcodes[rank]}"
                raise RuntimeError(f"rank {rank} failed {method!r}: {reason}") from None
        failures = [r for r in results if isinstance(r, _Failure)]
        if failures:
            self.close(kill=True)
            raise RuntimeError("".join(f"rank {f.rank} failed:\n{f.traceback}" for f in failures))
        return results

    def build(self, vllm_config: VllmConfig) -> None:
        """A new Worker on every rank (the constructor joins the world and makes the groups)."""
        self.call("build", vllm_config)

    def step(self, scheduler_output: SchedulerOutput) -> list:
        """Every rank's (ModelRunnerOutput, SamplerOutput) for one step."""
        return self.call("step", scheduler_output)

    def close(self, kill: bool = False) -> None:
        """Stop every rank: ask each to exit (or, ``kill``, kill it now); kill what is left after 10 s."""
        for conn, proc in zip(self.conns, self.procs):
            if kill:
                proc.kill()
            else:
                try:
                    conn.send(None)
                except OSError:
                    pass  # that rank is gone already
        for conn, proc in zip(self.conns, self.procs):
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
        self.exitcodes = [proc.exitcode for proc in self.procs]
        self.conns, self.procs = [], []
