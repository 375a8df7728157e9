"""EngineSnapshot: the engine between two steps, for a stream client that joins a run under way.

The live stream (``GET /v1/engine/events``) tells what *changes*: a request queued, a block allocated
or freed. A client that connects while requests wait and run never heard how they got there, so its
first message, ``Hello``, carries the state those events would have built, taken by the engine core
between the last step the client will not hear and the first one it will:

- every unfinished request, in the waiting queue's order and then the running batch's: its status,
  its prompt and computed tokens, the KV blocks it holds, its trace context, and the reason it waits
  as last recorded (None when nothing listened before the session started: then
  ``WaitingReasons.forget_all`` makes every waiting request record it again at the next step);
- the blocks the prefix cache can still find (stored, not evicted), held or free.

Applied to the snapshot, the events that follow account for every block: each ``BlocksFreed`` drops
a holder the client knows of. vLLM has no such thing (its ``ZmqEventPublisher`` keeps a replay buffer
of recent KV events instead); here the one subscriber asks the engine core for a snapshot whenever a
client joins (``engine/event_publisher.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from tracevllm.core.events import RequestWaiting
from tracevllm.request import RequestStatus

if TYPE_CHECKING:
    from tracevllm.core.sched.scheduler import Scheduler

_STATUS = {RequestStatus.WAITING: "waiting", RequestStatus.PREEMPTED: "preempted", RequestStatus.RUNNING: "running"}


class RequestSnapshot(msgspec.Struct):
    """One unfinished request. ``status``: "waiting", "preempted" (waiting again) or "running"."""

    request_id: str
    status: str
    arrival_time: float
    num_prompt_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int  # found in the prefix cache when it was last admitted (0 before)
    num_output_tokens: int
    num_preemptions: int
    block_ids: list[int]  # the blocks it holds, in its block table's order
    trace_headers: dict[str, str] | None = None
    waiting: RequestWaiting | None = None  # why it waits, as last recorded while someone listened


class EngineSnapshot(msgspec.Struct):
    """The engine between two steps (the module docstring says what for)."""

    requests: list[RequestSnapshot]  # the waiting queue in the scheduler's order, then the running batch
    cached_block_ids: list[int]  # blocks the prefix cache can still find


def take_snapshot(scheduler: Scheduler) -> EngineSnapshot:
    """The scheduler's requests and KV blocks now (the busy loop calls it between steps)."""
    kv = scheduler.kv_cache_manager
    recorded = scheduler.waiting_reasons.recorded
    requests = [
        RequestSnapshot(r.request_id, _STATUS[r.status], r.arrival_time, r.num_prompt_tokens, r.num_computed_tokens,
                        max(r.num_cached_tokens, 0), r.num_output_tokens, r.num_preemptions,
                        kv.get_block_ids(r.request_id), r.trace_headers, recorded.get(r.request_id))
        for r in [*scheduler.waiting, *scheduler.running]
    ]
    cached = [block.block_id for block in kv.block_pool.blocks if block.block_hash is not None]
    return EngineSnapshot(requests, cached)
