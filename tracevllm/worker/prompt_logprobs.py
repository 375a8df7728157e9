"""PromptLogprobs: the logprobs of a request's prompt tokens, computed chunk by chunk as the prompt runs.

The hidden state at position ``p`` predicts token ``p + 1``, so a prompt of ``P`` tokens has ``P - 1``
rows of prompt logprobs, and a chunk over positions ``[s, s + n)`` fills rows
``s .. min(s + n, P - 1) - 1`` (position ``P - 1`` predicts the first output token: that is the
sampler's). Chunks accumulate in a host table, returned with the step that computes the last prompt
token and then forgotten, so a request preempted later does not compute them again. The logits are
taken ``ROWS_PER_CHUNK`` positions at a time: a 2,048-token chunk of a 150k-token vocabulary would
otherwise be a 1.2 GB float32 tensor.
"""

from __future__ import annotations

import numpy as np
import torch

from tracevllm.sample.sampler import Sampler
from tracevllm.worker.gpu_input_batch import CachedRequestState, InputBatch
from tracevllm.model_runner_output import LogprobsTensors

ROWS_PER_CHUNK = 256


class PromptLogprobs:
    """The model runner's requests that asked for ``prompt_logprobs`` and have not had them yet."""

    def __init__(self) -> None:
        self.num_logprobs: dict[str, int] = {}  # the k each request asked for
        self.in_progress: dict[str, LogprobsTensors] = {}  # the table filled so far

    def __bool__(self) -> bool:
        return bool(self.num_logprobs)

    def add(self, req_id: str, num_logprobs: int) -> None:
        self.num_logprobs[req_id] = num_logprobs

    def remove(self, req_id: str) -> None:
        self.num_logprobs.pop(req_id, None)
        self.in_progress.pop(req_id, None)

    def compute(self, hidden_states: torch.Tensor, query_start_loc: np.ndarray, batch: InputBatch,
                requests: dict[str, CachedRequestState], model: torch.nn.Module,
                sampler: Sampler) -> dict[str, LogprobsTensors]:
        """Fill the rows this step's chunks cover; return the tables this step completes."""
        completed: dict[str, LogprobsTensors] = {}
        for req_id, num_logprobs in list(self.num_logprobs.items()):
            row = batch.req_id_to_index.get(req_id)
            if row is None:
                continue  # not scheduled this step
            prompt = requests[req_id].prompt_token_ids
            table = self.in_progress.get(req_id)
            if table is None:
                table = LogprobsTensors.empty_cpu(len(prompt) - 1, num_logprobs + 1)
                self.in_progress[req_id] = table
            start = int(batch.num_computed_tokens_cpu[row])
            first_row, num_scheduled = int(query_start_loc[row]), int(query_start_loc[row + 1] - query_start_loc[row])
            end = min(start + num_scheduled, len(prompt) - 1)
            for lo in range(start, end, ROWS_PER_CHUNK):
                hi = min(lo + ROWS_PER_CHUNK, end)
                rows = hidden_states[first_row + lo - start:first_row + hi - start]
                logprobs = model.compute_logits(rows).float().log_softmax(dim=-1)
                targets = torch.tensor(prompt[lo + 1:hi + 1], device=hidden_states.device)
                part = sampler.gather_logprobs(logprobs, num_logprobs, targets)
                table.logprob_token_ids[lo:hi] = part.logprob_token_ids.cpu()
                table.logprobs[lo:hi] = part.logprobs.cpu()
                table.selected_token_ranks[lo:hi] = part.selected_token_ranks.cpu()
            if start + num_scheduled >= len(prompt):
                completed[req_id] = self.in_progress.pop(req_id)
                del self.num_logprobs[req_id]
        return completed
