"""What one ``Scheduler.schedule()`` builds (``StepBatch``), and why it left requests waiting
(``HoldBack``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tracevllm.core.events import WaitingReason
from tracevllm.core.kv_cache_manager import KVShortage
from tracevllm.request import Request


@dataclass(slots=True)
class StepBatch:
    """The batch one ``schedule()`` builds: the token budget left, and what it was spent on (vLLM's
    names for ``schedule()``'s accumulators). Both phases add to it; the ``SchedulerOutput`` is made
    from it. ``req_to_new_block_ids``: the blocks a request gained this step (all of its blocks, for
    one just admitted)."""

    token_budget: int
    timestamp: float  # when the step was scheduled: the time of the events it records
    long_prefill_token_threshold: int = 0  # SchedulerConfig's: > 0 caps what one request computes a step
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    req_to_new_block_ids: dict[str, list[int]] = field(default_factory=dict)
    scheduled_running_reqs: list[Request] = field(default_factory=list)
    scheduled_new_reqs: list[Request] = field(default_factory=list)
    scheduled_resumed_reqs: list[Request] = field(default_factory=list)
    preempted_reqs: list[Request] = field(default_factory=list)

    def tokens_for(self, num_tokens: int) -> int:
        """How many of the ``num_tokens`` a request is behind it computes this step: as many as the budget
        left allows, and no more than ``long_prefill_token_threshold`` when that is set (a long prompt
        then goes in chunks of that size, leaving room for others)."""
        if 0 < self.long_prefill_token_threshold < num_tokens:
            num_tokens = self.long_prefill_token_threshold
        return min(num_tokens, self.token_budget)

    def add_running(self, request: Request, num_new_tokens: int, new_block_ids: list[int]) -> None:
        self.scheduled_running_reqs.append(request)
        self._spend(request, num_new_tokens, new_block_ids)

    def add_waiting(self, request: Request, num_new_tokens: int, block_ids: list[int], resumed: bool) -> None:
        """A request admitted from the waiting queue: new, or ``resumed`` after a preemption."""
        (self.scheduled_resumed_reqs if resumed else self.scheduled_new_reqs).append(request)
        self._spend(request, num_new_tokens, block_ids)

    def _spend(self, request: Request, num_new_tokens: int, new_block_ids: list[int]) -> None:
        self.num_scheduled_tokens[request.request_id] = num_new_tokens
        self.req_to_new_block_ids[request.request_id] = new_block_ids
        self.token_budget -= num_new_tokens

    def remove_running(self, request: Request) -> bool:
        """Take back a running request scheduled earlier in this step (a preemption victim under the
        priority policy): its tokens return to the budget. False if it was not scheduled."""
        if request.request_id not in self.num_scheduled_tokens:
            return False
        self.token_budget += self.num_scheduled_tokens.pop(request.request_id)
        del self.req_to_new_block_ids[request.request_id]
        self.scheduled_running_reqs.remove(request)
        return True


@dataclass(frozen=True, slots=True)
class HoldBack:
    """Why ``_schedule_waiting`` stopped with requests still waiting: the step had no room left
    (the token budget, ``max_num_seqs``, a preemption), or the request at the queue's head did not fit
    (the KV cache, its tokens in flight, a prompt over the budget without chunked prefill). The head
    waits for ``reason``; admission is in queue order, so every other request waits ``queued_behind``
    the one ahead of it. ``shortage``: for ``kv_cache``, the blocks the head needed (for its whole
    prompt, under ``scheduler_reserve_full_isl``) and those free."""

    reason: WaitingReason
    shortage: KVShortage | None = None

    def count_waiting(self, num_waiting: int) -> dict[str, int]:
        """How many of ``num_waiting`` requests wait for which reason (``SchedulerStats``)."""
        return {self.reason: 1, "queued_behind": num_waiting - 1} if num_waiting > 1 else {self.reason: 1}
