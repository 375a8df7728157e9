"""MessageQueue: one writer broadcasts each message to every reader through shared memory.

This is how the executor hands each step's ``SchedulerOutput`` to every worker (vLLM's
``vllm/distributed/device_communicators/shm_broadcast.py`` idea): the message is pickled and written
once into a ring of shared-memory slots, and every reader reads the same bytes, instead of being
pickled and sent once per rank.

The ring has ``num_slots`` slots of ``slot_bytes``. A message longer than a slot continues in the
next slots: its first slot starts with its length (8 bytes). Two semaphores per reader keep writer
and readers in step without spinning::

    writer, per slot:   free[r].acquire() for every reader r    (r has read what was here before)
                        copy the bytes in
                        ready[r].release() for every reader r
    reader r, per slot: ready[r].acquire()                     (blocks, using no CPU, while idle)
                        copy the bytes out
                        free[r].release()

So a reader may be at most ``num_slots`` slots behind the writer, and every reader sees every
message, in order. The queue is created by the writer, with the multiprocessing context that will
start the readers, and handed to each reader as an argument of its process; the reader then calls
``attach(reader_rank)``. The memory is ``multiprocessing``'s shared ``RawArray`` (an unlinked file's
mapping), freed when the last process holding it exits. A forked reader inherits the buffer and the
semaphores, which the ``fork`` context unlinks as it creates them, so nothing is left behind
however the processes end; a spawned reader opens the semaphores by name, and the writer's
process unlinks the names when it exits.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from multiprocessing.context import BaseContext

_LENGTH_BYTES = 8


class MessageQueue:
    def __init__(self, num_readers: int, ctx: BaseContext, num_slots: int = 8, slot_bytes: int = 1 << 20) -> None:
        self.num_readers, self.num_slots, self.slot_bytes = num_readers, num_slots, slot_bytes
        self.buffer = ctx.RawArray("B", num_slots * slot_bytes)
        self.ready = [ctx.Semaphore(0) for _ in range(num_readers)]
        self.free = [ctx.Semaphore(num_slots) for _ in range(num_readers)]
        self.reader_rank: int | None = None  # set in a reader's process by attach()
        self._slot = 0  # the next slot this end writes or reads

    def attach(self, reader_rank: int) -> None:
        """In a reader's process: read as ``reader_rank`` from now on."""
        self.reader_rank = reader_rank

    # ---- writer --------------------------------------------------------------------------------

    def enqueue(self, obj, should_abort: Callable[[], bool] = lambda: False) -> None:
        """Write ``obj`` for every reader. While a reader is ``num_slots`` behind, wait for it,
        checking ``should_abort`` every 100 ms (a reader that died never catches up):
        ``RuntimeError`` when it says so."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        payload = len(data).to_bytes(_LENGTH_BYTES, "little") + data
        for start in range(0, len(payload), self.slot_bytes):
            chunk = payload[start:start + self.slot_bytes]
            for free in self.free:
                while not free.acquire(timeout=0.1):
                    if should_abort():
                        raise RuntimeError("a reader of the message queue is gone")
            offset = self._slot * self.slot_bytes
            memoryview(self.buffer).cast("B")[offset:offset + len(chunk)] = chunk
            for ready in self.ready:
                ready.release()
            self._slot = (self._slot + 1) % self.num_slots

    # ---- reader --------------------------------------------------------------------------------

    def dequeue(self, timeout: float | None = None):
        """The next message. ``TimeoutError`` if none starts within ``timeout`` seconds (None: wait)."""
        assert self.reader_rank is not None, "attach() first"
        if not self.ready[self.reader_rank].acquire(timeout=timeout):
            raise TimeoutError("no message within the timeout")
        slot = self._take_slot()
        length = int.from_bytes(slot[:_LENGTH_BYTES], "little")
        parts = [bytes(slot[_LENGTH_BYTES:_LENGTH_BYTES + length])]
        self.free[self.reader_rank].release()
        remaining = length - len(parts[0])
        while remaining > 0:
            self.ready[self.reader_rank].acquire()
            parts.append(bytes(self._take_slot()[:remaining]))
            self.free[self.reader_rank].release()
            remaining -= len(parts[-1])
        return pickle.loads(b"".join(parts))

    def _take_slot(self) -> memoryview:
        offset = self._slot * self.slot_bytes
        self._slot = (self._slot + 1) % self.num_slots
        return memoryview(self.buffer).cast("B")[offset:offset + self.slot_bytes]
