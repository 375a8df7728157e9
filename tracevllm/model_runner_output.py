"""What the model runner returns: ModelRunnerOutput (the forward pass) and SamplerOutput (tokens).

A low module, as vLLM's ``vllm/v1/outputs.py``: the scheduler, the sampler, the executors and the
worker all import these messages, and none of them need import the worker to do so. (The user's
``RequestOutput`` is ``tracevllm/outputs.py``, as vLLM's is ``vllm/outputs.py``.)

Importing them loads no torch: a what-if drives the scheduler with no model (``tracevllm/whatif/``),
and its simulated worker fills ``SamplerOutput`` with numpy arrays, which read back (``tolist()``) as
torch's tensors do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tracevllm.engine import LogprobsLists
from tracevllm.core.events import CpuThreadsProbe, OneTimeCost

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(slots=True)
class LogprobsTensors:
    """Logprobs of the sampled rows: ``[num_rows, k + 1]`` token ids and logprobs (column 0 is the
    sampled token, then the top ``k``) and ``[num_rows]`` ranks of the sampled token (1 = best)."""

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor

    @classmethod
    def empty_cpu(cls, num_rows: int, num_columns: int) -> "LogprobsTensors":
        """A host table to fill in slices (a prompt's logprobs, one prefill chunk at a time)."""
        import torch

        return cls(
            torch.empty(num_rows, num_columns, dtype=torch.int64),
            torch.empty(num_rows, num_columns, dtype=torch.float32),
            torch.empty(num_rows, dtype=torch.int64),
        )

    def tolists(self) -> LogprobsLists:
        return LogprobsLists(
            self.logprob_token_ids.tolist(), self.logprobs.tolist(), self.selected_token_ranks.tolist()
        )


@dataclass(slots=True)
class ModelRunnerOutput:
    """One forward pass: logits only for the requests that sample this step.

    ``req_ids`` lists every scheduled request in batch order; ``sampling_req_ids`` the subset whose
    scheduled tokens reach the end of their sequence (decodes, last prefill chunks), in the row order
    of ``logits``. A prefill chunk that ends mid-prompt has nothing to sample and no logits row.
    ``logits`` stays on the worker's device; it is None once the output has left the worker.
    ``prompt_logprobs_dict``: for each request that asked for ``prompt_logprobs`` and samples its
    first token this step, the logprobs of its whole prompt (host tensors, one row per prompt
    position after the first, the prompt's own token in column 0).
    """

    req_ids: list[str]
    sampling_req_ids: list[str]
    logits: torch.Tensor | None  # [len(sampling_req_ids), vocab_size], float32
    prompt_logprobs_dict: dict[str, LogprobsTensors] = field(default_factory=dict)
    # Seconds per host part of the call (core/stages.py: StepPart), when ``SchedulerOutput.time_step_parts``.
    step_parts: dict[str, float] = field(default_factory=dict)
    # What the call paid once (a torch.compile inside the forward: worker/one_time_costs.py).
    one_time_costs: list[OneTimeCost] = field(default_factory=list)
    # The thread count measured again before the forward (worker/cpu_thread_follower.py), if it was.
    cpu_threads_probe: CpuThreadsProbe | None = None


# The stop_reason of a request finished with FinishReason.ERROR because its row failed to sample.
SAMPLING_FAILED = "the sampler got no valid distribution (NaN or infinite logits)"


@dataclass(slots=True)
class SamplerOutput:
    """One sampled token per row of the logits (rows = ``ModelRunnerOutput.sampling_req_ids``).

    Every id is inside the vocabulary. A row marked in ``failed`` had no valid distribution to
    sample from (NaN or infinite logits, or all -inf): its id is 0 and means nothing; the scheduler
    ends that request with ``FinishReason.ERROR``.
    """

    sampled_token_ids: torch.Tensor | np.ndarray  # [num_rows] int64 (numpy: a simulated worker's)
    # None when no row asked for logprobs; otherwise every row has ``max_num_logprobs + 1`` columns.
    logprobs_tensors: LogprobsTensors | None
    failed: torch.Tensor | None = None  # [num_rows] bool; None: no row failed
    # Seconds per host part of the call (core/stages.py: StepPart), when the step laps them; on CUDA
    # also the device time of the step's forward and logits (read after the sync, which it costs nothing).
    step_parts: dict[str, float] = field(default_factory=dict)
    forward_device_s: float | None = None
