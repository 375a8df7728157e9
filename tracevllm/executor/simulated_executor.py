"""SimulatedExecutor: an executor whose one worker runs no model, for a what-if replay (``tracevllm/whatif/``).

It stands where ``UniProcExecutor`` stands, behind the same ``Executor`` interface, so that the engine
core's own ``step()`` drives it: ``execute_model`` then ``sample_tokens``, each a ``collective_rpc`` to
its ``SimulatedWorker``. The worker keeps what a model runner keeps of each request (how many tokens it
has, how many are computed), and knows what the recorded run knew only at the end: how many tokens the
request produced, and whether it stopped by itself. So:

- ``execute_model`` takes the step's time on the replay's clock, the step-cost model's prediction for
  its batch (``tracevllm/step_cost.py``), and returns which requests sample: those whose scheduled tokens
  reach the end of their sequence, as the model runner decides;
- ``sample_tokens`` gives each of them a token: the recorded run's own, when it kept them (a golden
  schedule from vLLM, ``parity/rerun.py``); else ``STOP_TOKEN_ID`` as the last token of a request
  that stopped (EOS or a stop token), and a token id of the request's own before it. The scheduler's
  ``check_stop`` does the rest: it stops a request at that token, or at its ``max_tokens``, as it did
  in the run.

Nothing here imports torch: the sampled ids are a numpy array, which reads back as a tensor does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.executor.abstract import Executor
from tracevllm.model_runner_output import ModelRunnerOutput, SamplerOutput

# The replayed requests' EOS and stop token; a request's other tokens are positive ids of its own.
STOP_TOKEN_ID = 0


@dataclass(frozen=True, slots=True)
class RecordedOutput:
    """What a request produced in the recorded run: ``num_tokens`` output tokens, the last of them a
    stop (``stopped``) or not (it ran to its ``max_tokens``, or was aborted); ``token_ids``: the tokens
    themselves, where the run kept them."""

    num_tokens: int
    stopped: bool
    token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class _RequestState:
    num_tokens: int  # prompt + sampled so far (as the model runner's persistent batch counts them)
    num_sampled: int
    output: RecordedOutput
    token_id: int  # its tokens but the stop


class SimulatedWorker:
    """A worker without a model: what a ``Worker`` answers in a step, from the recorded outputs.

    ``step_seconds(num_tokens, is_decode, num_computed_tokens)``: the step's duration for its batch
    (each scheduled request's new tokens, whether it decodes, its tokens computed before the step);
    ``advance(seconds)`` moves the replay's clock."""

    def __init__(self, outputs: dict[str, RecordedOutput], step_seconds: Callable[[list, list, list], float],
                 advance: Callable[[float], None]) -> None:
        self.outputs = outputs
        self.step_seconds = step_seconds
        self.advance = advance
        self.requests: dict[str, _RequestState] = {}
        self._sampling: list[str] = []
        self._token_ids = itertools.count(STOP_TOKEN_ID + 1)  # one per request, never reused

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
        computed = {new.req_id: new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs}
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = _RequestState(len(new.prompt_token_ids), 0, self.outputs[new.req_id],
                                                      next(self._token_ids))
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        num_tokens, is_decode, num_computed, self._sampling = [], [], [], []
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            state, before = self.requests[req_id], computed[req_id]
            num_tokens.append(n)
            num_computed.append(before)
            is_decode.append(state.num_sampled > 0 and n == 1 and before + 1 == state.num_tokens)
            if before + n >= state.num_tokens:
                self._sampling.append(req_id)
        self.advance(self.step_seconds(num_tokens, is_decode, num_computed))
        return ModelRunnerOutput(list(scheduler_output.num_scheduled_tokens), list(self._sampling), None)

    def sample_tokens(self) -> SamplerOutput:
        token_ids = []
        for req_id in self._sampling:
            state = self.requests[req_id]
            state.num_sampled += 1
            state.num_tokens += 1
            recorded = state.output.token_ids
            if state.num_sampled <= len(recorded):
                token_ids.append(recorded[state.num_sampled - 1])
                continue
            last = state.num_sampled >= state.output.num_tokens
            token_ids.append(STOP_TOKEN_ID if last and state.output.stopped else state.token_id)
        return SamplerOutput(np.array(token_ids, dtype=np.int64), None)

    def record_engine_idle(self) -> None:
        """A worker's tracer would complete its files here; this worker has none."""


class SimulatedExecutor(Executor):
    """One ``SimulatedWorker`` in this process, as ``UniProcExecutor`` has one ``Worker``. It takes no
    ``VllmConfig``: there is no model to build, no device and one rank. ``async_scheduling``: the
    engine core keeps two batches in flight, as the run's did; each call runs at once all the same
    (``non_block`` returns a Future already done), as in one process."""

    def __init__(self, worker: SimulatedWorker, async_scheduling: bool = False) -> None:
        # Executor.__init__ reads a VllmConfig: none here.
        self.world_size, self.output_rank = 1, 0
        self.worker = worker
        self.async_scheduling = async_scheduling

    def _init_executor(self) -> None:
        """Nothing to start."""

    @property
    def max_concurrent_batches(self) -> int:
        return 2 if self.async_scheduling else 1

    def collective_rpc(self, method: str, args: tuple = (), unique_reply_rank: int | None = None,
                       non_block: bool = False) -> Any:
        result = getattr(self.worker, method)(*args)
        result = result if unique_reply_rank is not None else [result]
        if not non_block:
            return result
        future: Future = Future()
        future.set_result(result)
        return future
