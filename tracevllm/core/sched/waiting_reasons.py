"""Why each waiting request waits, recorded as a ``RequestWaiting`` when it changes.

The queue is admitted in order, so a waiting request waits for one of two things:
- at the head: whatever stopped this step's admissions (``HoldBack``: the token budget, max_num_seqs,
  the KV cache, a preemption, tokens in flight);
- anywhere else: the request just ahead of it (``queued_behind``), whatever that one waits for.

The head's reason may change every step, but a request behind it changes only when the request ahead
of it does: that one was admitted, aborted, or another was put in front. Each request thus records
one reason when it joins, one when it reaches the head, and the head's changes while it is there: a
queue of N requests costs O(N) records in all, not N at every change of the head's reason (which
flips between the spent budget and ``max_num_seqs`` every few steps of a busy engine). What the whole
queue waited for at a time is the reason its head recorded last (``viz/explain.py`` charges each
``queued_behind`` second to it).

Finding the changes must not walk the queue every step either (10,000 waiting requests would cost
milliseconds a step). The queue changes in three ways:
- its head leaves (admitted): only the new head's reason changes;
- requests join at the tail (FCFS): only they are new, each behind the one that joined before it;
- anything else (a preempted request put back in front, an aborted one taken out, a priority
  insert): the whole queue is walked once, at the next step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

from tracevllm.core.events import RequestWaiting
from tracevllm.core.kv_cache_manager import KVShortage
from tracevllm.core.sched.request_queue import FCFSRequestQueue, PriorityRequestQueue
from tracevllm.core.sched.step_batch import HoldBack, StepBatch
from tracevllm.request import Request


class WaitingReasons:
    """Each waiting request's last recorded reason, and what moved in the queue since the last step."""

    def __init__(self, waiting: FCFSRequestQueue | PriorityRequestQueue, joins_at_tail: bool) -> None:
        """``joins_at_tail``: new requests join at the tail (FCFS), not anywhere (a priority heap).
        ``waiting`` may be vLLM's own queue (``tracevllm/vllm/``): it is only peeked at and iterated."""
        self.waiting = waiting
        self.joins_at_tail = joins_at_tail
        self.recorded: dict[str, RequestWaiting] = {}  # request id -> its last recorded reason
        self.num_joined = 0  # requests added at the tail since the last step
        self.reordered = False  # the queue changed other than at its ends

    def joined(self) -> None:
        if self.joins_at_tail:
            self.num_joined += 1
        else:
            self.reordered = True

    def moved(self) -> None:
        """A request was put in front of the queue or taken out of its middle."""
        self.reordered = True

    def forget(self, request_id: str) -> None:
        """The request left the queue (admitted or finished)."""
        self.recorded.pop(request_id, None)

    def forget_all(self) -> None:
        """A new listener (the live stream's): every waiting request records its reason again at the
        next step, the whole queue walked."""
        self.recorded.clear()
        self.reordered = True

    def changed(self, hold_back: HoldBack, batch: StepBatch) -> Iterator[RequestWaiting]:
        """A ``RequestWaiting`` for each waiting request whose reason changed in the step of ``batch``,
        which ``hold_back`` stopped admitting."""
        for request, ahead in self._changes(hold_back.reason):
            if ahead is not None:
                waiting = RequestWaiting(request.request_id, batch.timestamp, "queued_behind", [ahead.request_id])
            else:
                spenders = [] if hold_back.reason != "token_budget" else sorted(
                    batch.num_scheduled_tokens, key=batch.num_scheduled_tokens.__getitem__, reverse=True)[:4]
                s = hold_back.shortage or KVShortage(0, 0)
                waiting = RequestWaiting(request.request_id, batch.timestamp, hold_back.reason, spenders,
                                         s.num_blocks_needed, s.num_free_blocks, s.full_sequence, s.num_watermark_blocks)
            self.recorded[request.request_id] = waiting
            yield waiting

    def _changes(self, reason: str) -> Iterator[tuple[Request, Request | None]]:
        """Each waiting request whose reason differs from the one it recorded, with the request ahead of
        it (None for the head, which waits for ``reason``)."""
        waiting = self.waiting
        if self.reordered or self.num_joined + 1 >= len(waiting):
            pairs: Iterable[tuple[Request | None, Request]] = zip([None, *waiting], waiting)
        else:  # the head, then the new requests at the tail (FCFS), each after the one before it
            tail = list(islice(reversed(waiting), self.num_joined + 1))[::-1] if self.num_joined else []
            pairs = [(None, waiting.peek_request()), *zip(tail, tail[1:])]
        self.reordered, self.num_joined = False, 0
        for ahead, request in pairs:
            key = (reason, "") if ahead is None else ("queued_behind", ahead.request_id)
            last = self.recorded.get(request.request_id)
            if last is None or key != (last.reason, last.blocked_by[0] if last.reason == "queued_behind" else ""):
                yield request, ahead
