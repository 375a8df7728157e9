"""The waiting queue: first come first served, or by priority.

Every operation the scheduler makes per request (add, put back at the front, look at or take the
head, remove an aborted request from anywhere) costs O(1) (FCFS) or O(log n) (priority), so that a
long queue does not slow each request down: with 300,000 requests waiting, a linear scan per
finished or aborted request made draining take seconds per step.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator

from tracevllm.request import Request


class FCFSRequestQueue:
    """Arrival order. A preempted request goes back to the front: it was admitted before the rest.

    An ``OrderedDict`` keyed by request id, not a deque: an aborted request is removed from the
    middle of the queue, which a deque does in O(n) (``deque.remove`` scans it), and a plain dict
    cannot put a request back at the front. The OrderedDict's linked list does all five operations
    in O(1).
    """

    def __init__(self) -> None:
        self._queue: OrderedDict[str, Request] = OrderedDict()

    def add_request(self, request: Request) -> None:
        self._queue[request.request_id] = request

    def prepend_request(self, request: Request) -> None:
        self._queue[request.request_id] = request
        self._queue.move_to_end(request.request_id, last=False)

    def peek_request(self) -> Request:
        return next(iter(self._queue.values()))

    def pop_request(self) -> Request:
        return self._queue.popitem(last=False)[1]

    def remove_request(self, request: Request) -> None:
        del self._queue[request.request_id]

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue.values())

    def __reversed__(self) -> Iterator[Request]:
        return reversed(self._queue.values())


class PriorityRequestQueue:
    """Lowest ``priority`` value first, ties by arrival time (``Request.__lt__``).

    A heap with lazy deletion: ``remove_request`` only marks the request (O(1)); a marked entry is
    dropped when it reaches the top (O(log n)), and the heap is rebuilt without the marked entries
    once they are half of it, so they never cost more than the live ones. Removing from the middle
    of a heap directly would be a scan and a re-heapify, O(n) per aborted request.
    """

    def __init__(self) -> None:
        self._heap: list[Request] = []
        self._removed: set[Request] = set()  # in the heap, but no longer in the queue

    def add_request(self, request: Request) -> None:
        if request in self._removed:  # its entry is still in the heap, in the right place
            self._removed.discard(request)
        else:
            heapq.heappush(self._heap, request)

    prepend_request = add_request  # a preempted request is placed by its priority like any other

    def peek_request(self) -> Request:
        self._drop_removed_top()
        return self._heap[0]

    def pop_request(self) -> Request:
        self._drop_removed_top()
        return heapq.heappop(self._heap)

    def remove_request(self, request: Request) -> None:
        self._removed.add(request)
        if len(self._removed) > len(self._heap) // 2:
            self._heap = [r for r in self._heap if r not in self._removed]
            heapq.heapify(self._heap)
            self._removed.clear()

    def _drop_removed_top(self) -> None:
        while self._heap and self._heap[0] in self._removed:
            self._removed.discard(heapq.heappop(self._heap))

    def __len__(self) -> int:
        return len(self._heap) - len(self._removed)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(r for r in self._heap if r not in self._removed))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"scheduling policy must be 'fcfs' or 'priority', got {policy!r}.")
