"""MultiprocExecutor: one worker process per rank on this machine.

::

    engine core process                                 worker processes (one per rank)
    ───────────────────                                 ───────────────────────────────
    collective_rpc(method, args) ── MessageQueue ──┬──> Worker-0: dequeue, call, reply
                                   (shared memory, ├──> Worker-1:  "
                                    written once)  └──> ...
    _collect thread <─────── one Pipe per rank ───────── ("ok", result) | ("error", traceback)

Every worker reads every call from the broadcast queue and runs it in order. A call answered by one
rank (``unique_reply_rank``: a step's output rank) gets a reply from that rank alone; any rank that
raises replies with its traceback. One collector thread reads the replies in call order and settles
each call's ``Future``; it also watches every process, so a worker that dies (or fails) fails the
waiting call, and every later one, within moments instead of hanging the engine, and the other
workers (which may be waiting for the lost one in a collective) are stopped. Each worker also
holds a death pipe from this process: if the engine core goes away, the workers exit.

The workers are forked where that is safe, else spawned (``tracevllm/utils.py`` says when). A forked
worker inherits every open descriptor of this process, including the write ends of the death pipes
(its own and those of the workers started before it): it closes them at once
(``register_after_fork``), or no death pipe would ever read EOF.
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.util
import os
import pickle
import queue
import signal
import threading
import weakref
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from typing import Any


from tracevllm.config import VllmConfig
from tracevllm.distributed.parallel_state import get_distributed_init_method, get_open_port
from tracevllm.distributed.shm_broadcast import MessageQueue
from tracevllm.utils import describe_current_exception, get_mp_context, set_process_title, start_process
from tracevllm.executor.abstract import Executor
from tracevllm.tracing import flush_traces

_STARTUP_TIMEOUT_S = 600.0  # loading a large model on every rank can take minutes


class MultiprocExecutor(Executor):
    def _init_executor(self) -> None:
        ctx = get_mp_context()
        init_method = get_distributed_init_method("127.0.0.1", get_open_port())
        self.rpc_broadcast_mq = MessageQueue(num_readers=self.world_size, ctx=ctx)
        self.procs: list[multiprocessing.Process] = []
        self.responses: list[Connection] = []
        death_writers = []
        for rank in range(self.world_size):
            response_reader, response_writer = ctx.Pipe(duplex=False)
            death_reader, death_writer = ctx.Pipe(duplex=False)
            multiprocessing.util.register_after_fork(death_writer, Connection.close)
            proc = ctx.Process(
                target=worker_main, name=f"Worker-{rank}", daemon=True,
                kwargs=dict(vllm_config=self.vllm_config, rank=rank, local_rank=rank,
                            distributed_init_method=init_method, rpc_broadcast_mq=self.rpc_broadcast_mq,
                            response=response_writer, death_pipe=death_reader),
            )
            start_process(proc)
            response_writer.close()  # the worker holds the only write end: EOF when it dies
            death_reader.close()
            self.procs.append(proc)
            self.responses.append(response_reader)
            death_writers.append(death_writer)
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, death_writers)
        self._buffered: list[collections.deque] = [collections.deque() for _ in range(self.world_size)]
        self._error: RuntimeError | None = None
        try:
            for rank in range(self.world_size):
                self._receive(rank, timeout=_STARTUP_TIMEOUT_S)  # ("ready", None) once the model is loaded
        except BaseException:
            self.shutdown()
            raise
        self._pending: queue.Queue[tuple[Future, list[int], bool] | None] = queue.Queue()
        self._collector = threading.Thread(target=self._collect, name="WorkerResponses", daemon=True)
        self._collector.start()

    def collective_rpc(
        self, method: str, args: tuple = (), unique_reply_rank: int | None = None, non_block: bool = False
    ) -> Any:
        if self._error is not None:
            raise self._error
        future: Future = Future()
        ranks = list(range(self.world_size)) if unique_reply_rank is None else [unique_reply_rank]
        self._pending.put((future, ranks, unique_reply_rank is not None))
        self.rpc_broadcast_mq.enqueue((method, args, unique_reply_rank), should_abort=lambda: self._error is not None)
        if non_block:
            return future
        return future.result()

    def _collect(self) -> None:
        """Settle the calls' futures in call order (workers reply in that order)."""
        while (item := self._pending.get()) is not None:
            future, ranks, unique = item
            try:
                results = [self._receive(rank) for rank in ranks]
                # A call answered by one rank (a step's output rank) resolves to its result alone.
                future.set_result(results[0] if unique else results)
            except RuntimeError as e:
                self._finalizer()  # the other ranks may wait for the failed one in a collective
                future.set_exception(e)
        # Shut down: fail whatever is still waiting.
        while not self._pending.empty():
            if (item := self._pending.get_nowait()) is not None:
                item[0].set_exception(self._error or RuntimeError("The executor was shut down."))

    def _receive(self, rank: int, timeout: float | None = None) -> Any:
        """The next reply of ``rank``. Replies other ranks send meanwhile wait in ``_buffered``; an
        error reply from any rank, or any worker's death, raises RuntimeError."""
        if self._error is not None:
            raise self._error
        while not self._buffered[rank]:
            ready = wait(self.responses + [p.sentinel for p in self.procs], timeout)
            if not ready:
                raise RuntimeError(f"Worker-{rank} did not answer within {timeout:.0f} s.")
            for r, connection in enumerate(self.responses):
                if connection in ready:
                    self._buffered[r].append(self._read(r))
            for r, proc in enumerate(self.procs):
                if proc.sentinel in ready and not self.responses[r].poll():
                    raise self._died(r)
        return self._buffered[rank].popleft()

    def _read(self, rank: int) -> Any:
        try:
            status, payload = pickle.loads(self.responses[rank].recv_bytes())
        except (EOFError, OSError):
            raise self._died(rank) from None
        if status == "error":
            raise self._fail(f"Worker-{rank} failed: {payload}")
        return payload

    def _died(self, rank: int) -> RuntimeError:
        proc = self.procs[rank]
        proc.join(5)  # it is gone or going: reap it, so that its exit code is known
        return self._fail(f"Worker-{rank} (pid {proc.pid}) died with exit code {proc.exitcode}.")

    def _fail(self, message: str) -> RuntimeError:
        self._error = RuntimeError(message)
        return self._error

    def shutdown(self) -> None:
        if getattr(self, "_collector", None) is not None:
            self._pending.put(None)
        self._finalizer()


def _stop_workers(procs: list[multiprocessing.Process], death_writers: list[Connection]) -> None:
    """Closing the death pipes makes every worker exit; SIGKILL whoever is still there after 5 s."""
    for writer in death_writers:
        writer.close()
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


# ---- the worker process ------------------------------------------------------------------------


def worker_main(vllm_config: VllmConfig, rank: int, local_rank: int, distributed_init_method: str,
                rpc_broadcast_mq: MessageQueue, response: Connection, death_pipe: Connection) -> None:
    """A worker process: build the rank's Worker, say ready, then run broadcast calls until killed."""
    set_process_title(f"Worker-{rank}")
    threading.Thread(target=_exit_when_engine_dies, args=(death_pipe,), daemon=True).start()

    def reply(status: str, payload: Any) -> None:
        response.send_bytes(pickle.dumps((status, payload), protocol=pickle.HIGHEST_PROTOCOL))

    try:
        from tracevllm.worker.gpu_worker import Worker

        worker = Worker(vllm_config, rank=rank, local_rank=local_rank, distributed_init_method=distributed_init_method)
        worker.load_model()
    except Exception:
        reply("error", describe_current_exception())
        return
    reply("ready", None)
    rpc_broadcast_mq.attach(rank)
    while True:
        method, args, unique_reply_rank = rpc_broadcast_mq.dequeue()
        try:
            result = getattr(worker, method)(*args)
        except Exception:
            reply("error", describe_current_exception())
            continue
        if unique_reply_rank is None or unique_reply_rank == rank:
            reply("ok", result)


def _exit_when_engine_dies(death_pipe: Connection) -> None:
    """The engine core closed the pipe (shut down) or died: complete the trace files and go, even
    from the middle of a collective that will never finish. First, as a normal exit would, run the
    process's multiprocessing finalizers: a spawned worker's named semaphores (tqdm makes one for
    its progress bars) are unlinked, not left for the resource tracker to find as "leaked"."""
    try:
        death_pipe.recv()
    except EOFError:
        pass
    flush_traces()
    multiprocessing.util._run_finalizers(0)
    os.kill(os.getpid(), signal.SIGKILL)

