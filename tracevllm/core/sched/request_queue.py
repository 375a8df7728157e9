"""The waiting queue: first come first served, or by priority."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from tracevllm.request import Request


class FCFSRequestQueue:
    """Arrival order. A preempted request goes back to the front: it was admitted before the rest."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek_request(self) -> Request:
        return self._queue[0]

    def pop_request(self) -> Request:
        return self._queue.popleft()

    def remove_request(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue:
    """Lowest ``priority`` value first, ties by arrival time (``Request.__lt__``)."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    prepend_request = add_request  # a preempted request is placed by its priority like any other

    def peek_request(self) -> Request:
        return self._heap[0]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)

    def remove_request(self, request: Request) -> None:
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"scheduling policy must be 'fcfs' or 'priority', got {policy!r}.")
