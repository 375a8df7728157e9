"""SchedulerOutput: what the scheduler tells the model runner to do in one step.

A request's full description (prompt, sampling params) is sent once, in ``NewRequestData``, the step
it is first scheduled. After that the model runner keeps it in its persistent batch and each step
only gets a diff in ``CachedRequestData``: the blocks added and the new ``num_computed_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracevllm.request import Request
from tracevllm.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int

    @classmethod
    def from_request(cls, request: Request, block_ids: list[int]) -> "NewRequestData":
        return cls(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            eos_token_id=request.eos_token_id,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
        )


@dataclass(slots=True)
class CachedRequestData:
    """Diffs for requests the model runner has seen before, as parallel lists.

    For a request resumed after preemption, ``new_block_ids[i]`` is its whole new block list (its old
    blocks were freed) rather than blocks to append. ``new_token_ids`` (pipeline parallelism only,
    else empty): the tokens each request computes this step, from position ``num_computed_tokens[i]``
    on; the stages that do not sample learn the sampled tokens from it.
    """

    req_ids: list[str] = field(default_factory=list)
    resumed_from_preemption: list[bool] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # req_id -> tokens to compute this step (prefill chunk length, or 1 for a decode).
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests preempted this step: the runner drops them from its batch (their KV is gone).
    preempted_req_ids: set[str]
    # Requests finished since the last step: the runner forgets them.
    finished_req_ids: set[str]
    # What the engine core's observers give the step to carry to the workers' observers
    # (``StepContextProvider``: the tracer's is the step's trace context); None when nobody does.
    step_context: dict[str, str] | None = None
    # Whether the model runner laps its host path (``StepPart``) for the step's record: the engine
    # core asks only when someone observes, and only in ``step()`` (there the laps fall inside the stages).
    time_step_parts: bool = False
