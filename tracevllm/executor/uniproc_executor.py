"""UniProcExecutor: runs the one Worker in the engine core's own process (world size 1)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from tracevllm.executor.abstract import Executor
from tracevllm.worker.gpu_worker import Worker


class UniProcExecutor(Executor):
    def _init_executor(self) -> None:
        self.worker = Worker(self.vllm_config)
        self.worker.load_model()

    def collective_rpc(
        self, method: str, args: tuple = (), unique_reply_rank: int | None = None, non_block: bool = False
    ) -> Any:
        result = getattr(self.worker, method)(*args)
        if unique_reply_rank is None:
            result = [result]
        if not non_block:
            return result
        future: Future = Future()
        future.set_result(result)
        return future
