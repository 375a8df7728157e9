"""MessageQueue: every reader gets every message, in order, through a ring smaller than the traffic
(wrap-around) and for messages larger than a slot; a writer facing a reader that is gone stops when
told to, instead of waiting for ever."""

from __future__ import annotations

import multiprocessing

import pytest

from tracevllm.distributed.shm_broadcast import MessageQueue


def _read_all(queue: MessageQueue, rank: int, out) -> None:
    queue.attach(rank)
    received = []
    while (message := queue.dequeue(timeout=30)) is not None:
        received.append(message)
    out.send(received)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_every_reader_gets_every_message_in_order(method):
    ctx = multiprocessing.get_context(method)  # forked readers inherit the queue, spawned ones unpickle it
    queue = MessageQueue(num_readers=2, ctx=ctx, num_slots=4, slot_bytes=1024)
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_read_all, args=(queue, r, pipes[r][1]), daemon=True) for r in range(2)]
    for proc in procs:
        proc.start()
    # 50 messages through 4 slots (the writer waits for the slower reader), one spanning 40 slots.
    messages = [{"step": i, "tokens": list(range(i))} for i in range(50)] + [b"x" * 40_000, "last"]
    for message in messages:
        queue.enqueue(message)
    queue.enqueue(None)
    assert [pipe[0].recv() for pipe in pipes] == [messages, messages]
    for proc in procs:
        proc.join(10)


def test_dequeue_times_out_and_a_stuck_writer_can_give_up():
    queue = MessageQueue(num_readers=1, ctx=multiprocessing.get_context("fork"), num_slots=2, slot_bytes=64)
    queue.attach(0)  # this process reads too
    with pytest.raises(TimeoutError):
        queue.dequeue(timeout=0.05)
    queue.enqueue("a")
    queue.enqueue("b")
    with pytest.raises(RuntimeError, match="reader"):
        queue.enqueue("c", should_abort=lambda: True)  # the ring is full and nobody reads
    assert queue.dequeue() == "a" and queue.dequeue() == "b"
