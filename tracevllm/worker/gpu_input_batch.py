"""The persistent batch: per-request state the model runner keeps between steps.

``CachedRequestState`` is everything the runner knows about one request (it outlives preemption, so
a resumed request keeps its tokens and its seeded generator). ``InputBatch`` lays the requests that
run this step out in rows of host arrays (token ids, computed-token counts, block table, sampling
parameters), so that building a step's inputs is a handful of vectorised numpy operations. Rows are
kept dense: ``condense`` moves the last rows into holes left by removed requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tracevllm.sample.metadata import SamplingMetadata
from tracevllm.sampling_params import SamplingParams
from tracevllm.worker.block_table import BlockTable


@dataclass(slots=True)
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    generator: torch.Generator | None
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    eos_token_id: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    def __init__(
        self, max_num_reqs: int, max_model_len: int, block_size: int, vocab_size: int, device: torch.device
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.device = device
        self.req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self.requests: dict[str, CachedRequestState] = {}  # the rows' states, by id

        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int32)
        max_blocks = -(-max_model_len // block_size)
        self.block_table = BlockTable(max_num_reqs, max_blocks, block_size)

        self.temperature = np.zeros(max_num_reqs, dtype=np.float32)
        self.top_p = np.ones(max_num_reqs, dtype=np.float32)
        self.top_k = np.full(max_num_reqs, vocab_size, dtype=np.int64)
        self.min_p = np.zeros(max_num_reqs, dtype=np.float32)
        self.presence_penalties = np.zeros(max_num_reqs, dtype=np.float32)
        self.frequency_penalties = np.zeros(max_num_reqs, dtype=np.float32)
        self.repetition_penalties = np.ones(max_num_reqs, dtype=np.float32)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, state: CachedRequestState) -> None:
        """Put ``state`` in the first free row (rows are dense after ``condense``)."""
        row = len(self.req_ids)
        assert row < self.max_num_reqs, "more running requests than max_num_seqs"
        self.req_ids.append(state.req_id)
        self.req_id_to_index[state.req_id] = row
        self.requests[state.req_id] = state

        n_prompt = len(state.prompt_token_ids)
        self.token_ids_cpu[row, :n_prompt] = state.prompt_token_ids
        self.token_ids_cpu[row, n_prompt : state.num_tokens] = state.output_token_ids
        self.num_tokens[row] = state.num_tokens
        self.num_computed_tokens_cpu[row] = state.num_computed_tokens
        self.block_table.add_row(state.block_ids, row)

        p = state.sampling_params
        self.temperature[row] = p.temperature
        self.top_p[row] = p.top_p
        # -1 and any k >= the vocabulary mean "all tokens" (vLLM's InputBatch clamps the same way).
        self.top_k[row] = min(p.top_k, self.vocab_size) if p.top_k > 0 else self.vocab_size
        self.min_p[row] = p.min_p
        self.presence_penalties[row] = p.presence_penalty
        self.frequency_penalties[row] = p.frequency_penalty
        self.repetition_penalties[row] = p.repetition_penalty

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's row (leaving a hole for ``condense``); None if it had no row."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        del self.requests[req_id]
        return row

    def condense(self) -> None:
        """Fill holes with the last rows so that rows ``0 .. num_reqs-1`` are the live requests."""
        holes = [i for i, r in enumerate(self.req_ids) if r is None]
        for hole in holes:
            while self.req_ids and self.req_ids[-1] is None:
                self.req_ids.pop()
            last = len(self.req_ids) - 1
            if hole >= last:
                break
            req_id = self.req_ids.pop()
            assert req_id is not None
            self._move_row(last, hole)
            self.req_ids[hole] = req_id
            self.req_id_to_index[req_id] = hole
        while self.req_ids and self.req_ids[-1] is None:
            self.req_ids.pop()

    def _move_row(self, src: int, dst: int) -> None:
        n = self.num_tokens[src]
        self.token_ids_cpu[dst, :n] = self.token_ids_cpu[src, :n]
        self.block_table.move_row(src, dst)
        for array in (
            self.num_tokens, self.num_computed_tokens_cpu, self.temperature, self.top_p, self.top_k,
            self.min_p, self.presence_penalties, self.frequency_penalties, self.repetition_penalties,
        ):
            array[dst] = array[src]

    def append_token(self, row: int, token_id: int) -> None:
        state = self.requests[self.req_ids[row]]  # type: ignore[index]
        state.output_token_ids.append(token_id)
        self.token_ids_cpu[row, self.num_tokens[row]] = token_id
        self.num_tokens[row] += 1

    def make_sampling_metadata(self, rows: np.ndarray) -> SamplingMetadata:
        """Sampling tensors for the given batch rows, in that order (the rows of the logits)."""
        states = [self.requests[self.req_ids[r]] for r in rows]  # type: ignore[index]
        params = [s.sampling_params for s in states]
        dev = self.device

        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array[rows]).to(dev, non_blocking=True)

        greedy = [p.greedy for p in params]
        all_greedy, all_random = all(greedy), not any(greedy)
        no_penalties = all(
            p.presence_penalty == 0.0 and p.frequency_penalty == 0.0 and p.repetition_penalty == 1.0
            for p in params
        )
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        prompt_token_ids = None
        if any(p.repetition_penalty != 1.0 for p in params):
            width = max(len(s.prompt_token_ids) for s in states)
            prompt = np.full((len(states), width), self.vocab_size, dtype=np.int64)
            for i, s in enumerate(states):
                prompt[i, : len(s.prompt_token_ids)] = s.prompt_token_ids
            prompt_token_ids = torch.from_numpy(prompt).to(dev)
        min_tokens = {}
        for i, s in enumerate(states):
            p = s.sampling_params
            if len(s.output_token_ids) < p.min_tokens:
                banned = set(p.stop_token_ids)
                if s.eos_token_id is not None and not p.ignore_eos:
                    banned.add(s.eos_token_id)
                min_tokens[i] = (p.min_tokens, banned)
        bad_words = {i: p.bad_words_token_ids for i, p in enumerate(params) if p.bad_words_token_ids}
        top_k = None
        if any(p.top_k != -1 and p.top_k < self.vocab_size for p in params):
            top_k = self.top_k[rows]

        return SamplingMetadata(
            temperature=None if all_greedy else tensor(self.temperature),
            all_greedy=all_greedy,
            all_random=all_random,
            top_p=None if all(p.top_p == 1.0 for p in params) else tensor(self.top_p),
            top_k=None if top_k is None else torch.from_numpy(top_k).to(dev, non_blocking=True),
            max_top_k=0 if top_k is None else int(top_k[top_k < self.vocab_size].max(initial=1)),
            min_p=None if all(p.min_p == 0.0 for p in params) else tensor(self.min_p),
            generators={i: s.generator for i, s in enumerate(states) if s.generator is not None},
            max_num_logprobs=max(logprobs) if logprobs else None,
            no_penalties=no_penalties,
            presence_penalties=None if no_penalties else tensor(self.presence_penalties),
            frequency_penalties=None if no_penalties else tensor(self.frequency_penalties),
            repetition_penalties=None if no_penalties else tensor(self.repetition_penalties),
            prompt_token_ids=prompt_token_ids,
            output_token_ids=[s.output_token_ids for s in states] if not no_penalties or bad_words else [],
            min_tokens=min_tokens,
            bad_words_token_ids=bad_words,
        )
