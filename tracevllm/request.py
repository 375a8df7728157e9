"""Request: the scheduler's view of one request, from arrival until its KV blocks are freed."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from tracevllm.core.events import RequestEvent
from tracevllm.engine import EngineCoreRequest, FinishReason
from tracevllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from tracevllm.core.kv_cache_utils import BlockHash


class RequestStatus(enum.IntEnum):
    """WAITING and PREEMPTED requests sit in the waiting queue; everything after RUNNING is finished."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()  # failed in the engine core; the rest of the batch goes on

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> FinishReason | None:
        return _FINISHED_REASONS.get(status)


_FINISHED_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Request:
    """One request inside the engine core.

    The one rule the scheduler follows: each step, ``num_computed_tokens`` (tokens whose KV is in the
    cache) catches up with ``num_tokens`` (prompt + generated so far) as far as the token budget
    allows. A request whose ``num_computed_tokens`` reaches ``num_tokens`` gets a new token sampled.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        arrival_time: float,
        priority: int = 0,
        trace_headers: dict[str, str] | None = None,
    ) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.trace_headers = trace_headers
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.max_tokens = sampling_params.max_tokens

        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # Asynchronous scheduling (core/sched/async_scheduler.py): tokens scheduled to be sampled whose
        # ids are not back yet (``num_computed_tokens`` counts them already).
        self.num_output_placeholders = 0
        # Prompt tokens found in the prefix cache the first time the request was scheduled (-1: not yet).
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        # Hashes of the request's full blocks, parent-chained; filled by the KV cache manager.
        self.block_hashes: list[BlockHash] = []
        # State changes not yet sent to the front end (in the request's next EngineCoreOutput).
        self.events: list[RequestEvent] = []

    @classmethod
    def from_engine_core_request(cls, request: EngineCoreRequest) -> "Request":
        return cls(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            eos_token_id=request.eos_token_id,
            arrival_time=request.arrival_time,
            priority=request.priority,
            trace_headers=request.trace_headers,
        )

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self._output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        return RequestStatus.get_finished_reason(self.status)

    def take_events(self) -> list[RequestEvent] | None:
        if not self.events:
            return None
        events, self.events = self.events, []
        return events

    def __lt__(self, other: "Request") -> bool:
        """Order used by priority scheduling: lower ``priority`` first, then earlier arrival."""
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )
