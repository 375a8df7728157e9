"""GPUModelRunner: turns a SchedulerOutput into one forward pass and one sampled token per request.

Device-agnostic despite vLLM's name: the same code runs on CPU and CUDA. Per step:

1. ``_update_states``: apply the scheduler's diff to the persistent batch (new requests, appended
   blocks, resumed and preempted requests, finished ones), then condense the rows.
2. ``_prepare_inputs``: flatten every scheduled token of every row into one sequence. For rows
   ``r`` with ``n_r`` scheduled tokens starting at ``num_computed_tokens[r]`` (all vectorised)::

       req_indices  = [0,0,0, 1, 2,2]            # row of each token   (n = [3, 1, 2])
       positions    = num_computed[req_indices] + [0,1,2, 0, 0,1]
       input_ids    = token_ids_cpu[req_indices, positions]
       slot_mapping = block_table[req_indices, positions // B] * B + positions % B
       query_start_loc = [0, 3, 4, 6],  seq_lens = num_computed + n

3. The model runs on all tokens; logits are computed only at the last token of the rows that sample
   (their scheduled tokens reach the end of the sequence).
4. ``sample_tokens``: the sampler picks one token per sampling row; the runner appends it to its
   own copy of the sequence, so the next step needs only the scheduler's diff.
"""

from __future__ import annotations

import numpy as np
import torch

from tracevllm.attention.backends.abstract import AttentionMetadata
from tracevllm.attention.layer import bind_kv_cache
from tracevllm.attention.selector import get_attn_backend
from tracevllm.config import VllmConfig
from tracevllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from tracevllm.models.loader import load_model
from tracevllm.sample.sampler import Sampler
from tracevllm.sampling_params import SamplingParams
from tracevllm.worker.gpu_input_batch import CachedRequestState, InputBatch
from tracevllm.worker.outputs import ModelRunnerOutput, SamplerOutput


class GPUModelRunner:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = vllm_config.device
        self.dtype = self.model_config.dtype
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = self.model_config.max_model_len
        self.attn_backend = get_attn_backend(vllm_config.attention_backend, self.device)
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sampler = Sampler()
        # Every request the runner knows, including preempted ones waiting to resume.
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(
            max_num_reqs=vllm_config.scheduler_config.max_num_seqs,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            vocab_size=self.model_config.vocab_size,
            device=self.device,
        )
        self._sampling_rows = np.zeros(0, dtype=np.int64)
        self._arange = np.arange(vllm_config.scheduler_config.max_num_batched_tokens + 1, dtype=np.int64)

    # ---- set-up --------------------------------------------------------------------------------

    def load_model(self) -> None:
        self.model = load_model(self.model_config.model, self.dtype, self.device, self.attn_backend)

    def kv_cache_spec(self) -> list[tuple[int, int]]:
        """(num_kv_heads, head_dim) of each attention layer, in layer order."""
        from tracevllm.attention.layer import Attention

        return [(m.num_kv_heads, m.head_dim) for m in self.model.modules() if isinstance(m, Attention)]

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """One (key, value) pair of ``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer."""
        self.kv_caches = []
        for num_kv_heads, head_dim in self.kv_cache_spec():
            shape = self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, num_kv_heads, head_dim)
            self.kv_caches.append(
                (torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device))
            )
        bind_kv_cache(self.model, self.kv_caches)

    def warm_up(self, num_tokens: int = 32) -> int:
        """One dummy request through the forward pass and the sampler, as a step would run it, so
        that the first real step does not pay one-time costs (allocations, kernel selection; on
        CUDA, compiling the Triton kernels). Its KV goes to the first blocks, which no request holds
        yet and no hash names; the batch is empty again afterwards. Returns the tokens it ran."""
        num_tokens = min(num_tokens, self.vllm_config.scheduler_config.max_num_batched_tokens, self.max_model_len - 1)
        num_blocks = -(-num_tokens // self.block_size)
        dummy = NewRequestData("warmup", list(range(num_tokens)), SamplingParams(temperature=0.0, max_tokens=1),
                               None, list(range(num_blocks)), 0)
        run = SchedulerOutput([dummy], CachedRequestData(), {"warmup": num_tokens}, num_tokens, set(), set())
        self.sample_tokens(self.execute_model(run))
        self._update_states(SchedulerOutput([], CachedRequestData(), {}, 0, set(), {"warmup"}))
        return num_tokens

    # ---- one step ------------------------------------------------------------------------------

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        # Preempted rows and rows not scheduled this step leave the batch; their state stays.
        scheduled = scheduler_output.num_scheduled_tokens
        for req_id in [r for r in batch.req_id_to_index if r not in scheduled]:
            batch.remove_request(req_id)

        to_add: list[CachedRequestState] = []
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            state = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=new.prompt_token_ids,
                sampling_params=params,
                generator=generator,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                eos_token_id=new.eos_token_id,
            )
            self.requests[new.req_id] = state
            to_add.append(state)

        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_block_ids = cached.new_block_ids[i]
            if cached.resumed_from_preemption[i]:
                state.block_ids = list(new_block_ids)
            else:
                state.block_ids.extend(new_block_ids)
            row = batch.req_id_to_index.get(req_id)
            if row is None:
                to_add.append(state)
            else:
                batch.num_computed_tokens_cpu[row] = state.num_computed_tokens
                batch.block_table.append_row(new_block_ids, row)

        batch.condense()
        for state in to_add:
            batch.add_request(state)

    def _prepare_inputs(self, scheduler_output: SchedulerOutput):
        batch = self.input_batch
        num_reqs = batch.num_reqs
        req_ids = batch.req_ids[:num_reqs]
        num_scheduled = np.array([scheduler_output.num_scheduled_tokens[r] for r in req_ids], dtype=np.int64)
        total = int(num_scheduled.sum())
        assert total == scheduler_output.total_num_scheduled_tokens

        cu_num_tokens = np.cumsum(num_scheduled)
        req_indices = np.repeat(np.arange(num_reqs), num_scheduled)
        offsets = self._arange[:total] - np.repeat(cu_num_tokens - num_scheduled, num_scheduled)
        num_computed = batch.num_computed_tokens_cpu[:num_reqs].astype(np.int64)
        positions = num_computed[req_indices] + offsets
        input_ids = batch.token_ids_cpu[req_indices, positions]
        slot_mapping = batch.block_table.compute_slot_mapping(req_indices, positions)

        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
        query_start_loc[1:] = cu_num_tokens
        seq_lens = (num_computed + num_scheduled).astype(np.int32)
        # A row samples when its scheduled tokens reach the end of what it knows.
        self._sampling_rows = np.nonzero(seq_lens >= batch.num_tokens[:num_reqs])[0]
        logits_indices = cu_num_tokens[self._sampling_rows] - 1

        dev = self.device
        attn_metadata = AttentionMetadata(
            num_actual_tokens=total,
            max_query_len=int(num_scheduled.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=torch.from_numpy(query_start_loc).to(dev),
            seq_lens=torch.from_numpy(seq_lens).to(dev),
            block_table=batch.block_table.get_device_tensor(num_reqs, dev),
            slot_mapping=torch.from_numpy(slot_mapping).to(dev),
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
        )
        return (
            torch.from_numpy(input_ids).to(dev),
            torch.from_numpy(positions).to(dev),
            attn_metadata,
            torch.from_numpy(logits_indices).to(dev),
        )

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(scheduler_output)
        batch = self.input_batch
        req_ids = list(batch.req_ids[: batch.num_reqs])
        if scheduler_output.total_num_scheduled_tokens == 0:
            self._sampling_rows = np.zeros(0, dtype=np.int64)
            return ModelRunnerOutput(req_ids, [], None)
        input_ids, positions, attn_metadata, logits_indices = self._prepare_inputs(scheduler_output)
        hidden_states = self.model(input_ids, positions, attn_metadata)
        logits = self.model.compute_logits(hidden_states[logits_indices])
        return ModelRunnerOutput(
            req_ids=req_ids,
            sampling_req_ids=[req_ids[r] for r in self._sampling_rows],
            logits=logits,
        )

    @torch.inference_mode()
    def sample_tokens(self, model_runner_output: ModelRunnerOutput) -> SamplerOutput:
        rows = self._sampling_rows
        if len(rows) == 0:
            return SamplerOutput(torch.zeros(0, dtype=torch.int64), None)
        metadata = self.input_batch.make_sampling_metadata(rows)
        output = self.sampler(model_runner_output.logits, metadata)
        sampled = output.sampled_token_ids.cpu()  # the step's one device-to-host sync
        for row, token_id in zip(rows.tolist(), sampled.tolist()):
            self.input_batch.append_token(row, token_id)
        logprobs = output.logprobs_tensors
        if logprobs is not None:
            logprobs.logprob_token_ids = logprobs.logprob_token_ids.cpu()
            logprobs.logprobs = logprobs.logprobs.cpu()
            logprobs.selected_token_ranks = logprobs.selected_token_ranks.cpu()
        return SamplerOutput(sampled, logprobs)
