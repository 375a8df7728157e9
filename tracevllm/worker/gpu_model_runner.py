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

3. The model runs on all tokens (``model_forward``: the model itself, or on CUDA the decode graphs
   swapped in for it, ``worker/cuda_graphs.py``); logits are computed only at the last token of the
   rows that sample (their scheduled tokens reach the end of the sequence).
4. ``sample_tokens``: the sampler picks one token per sampling row; the runner appends it to its
   own copy of the sequence, so the next step needs only the scheduler's diff.

When the engine core asks (``SchedulerOutput.time_step_parts``: someone observes the step), the
runner laps these as the step's host parts (``core/stages.py``: ``StepPart``) and returns them in
its outputs, across the executor; on CUDA it also times the forward and the logits on the device.
Otherwise the laps are ``NO_LAPS``, whose ``lap`` does nothing.

Requests that ask for ``prompt_logprobs`` also get logits at their prompt positions, chunk by chunk
(``worker/prompt_logprobs.py``).

Pipeline parallelism: every stage runs steps 1-3 on the same SchedulerOutput, but only over its own
layers. A stage that is not the first receives the previous stage's ``IntermediateTensors`` before
its forward; one that is not the last sends its own after it (without waiting for them to arrive, so
it can start the next batch at once) and returns no logits; only the last stage samples. The other
stages learn the sampled tokens a step later, from ``CachedRequestData.new_token_ids``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from tracevllm.attention.backends.abstract import AttentionMetadata, AttentionMetadataBuilder
from tracevllm.attention.layer import Attention, bind_kv_cache
from tracevllm.attention.selector import get_attn_backend
from tracevllm.config import VllmConfig
from tracevllm.core.event_recorder import NO_LAPS, LapTimer
from tracevllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from tracevllm.core.stages import StepPart
from tracevllm.distributed.parallel_state import COMM_CLOCK, get_pp_group
from tracevllm.model_runner_output import ModelRunnerOutput, SamplerOutput
from tracevllm.models.loader import load_model
from tracevllm.models.utils import IntermediateTensors
from tracevllm.optimizations import OptimizationConfig
from tracevllm.sample.ops.topk_topp_sampler import RandomDraw, sample_from_softmax, two_level_sampling
from tracevllm.sample.sampler import Sampler
from tracevllm.sampling_params import SamplingParams
from tracevllm.worker.cuda_graphs import CudaGraphs
from tracevllm.worker.gpu_input_batch import CachedRequestState, InputBatch
from tracevllm.worker.prompt_logprobs import PromptLogprobs

logger = logging.getLogger(__name__)


def random_draw(device: torch.device, config: OptimizationConfig) -> RandomDraw:
    """How the sampler draws a random row's token. On a CPU, optimisation "two_level_sampling" where
    it is on: fewer passes over the vocabulary. Elsewhere the plain draw: on CUDA, where every
    operation is a kernel launch and the host's launches bound a small model's decode step, the
    two-level draw's 29 operations (a random batch's, whole sampler) cost more launches than the plain
    draw's 13 (``benchmarks/sampler_draws.py``)."""
    if device.type == "cpu" and config.enabled("two_level_sampling"):
        return two_level_sampling
    return sample_from_softmax


class GPUModelRunner:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = vllm_config.device
        self.dtype = self.model_config.dtype
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = self.model_config.max_model_len
        self.attn_backend = get_attn_backend(vllm_config.attention_backend, self.device,
                                             vllm_config.optimization_config)
        # Made by load_model, once the layers exist: the backend's metadata builder, and what the backend
        # runs (its name, and what it chose at start-up) for the start-up log and trace.
        self.attn_metadata_builder: AttentionMetadataBuilder | None = None
        self.attention_backend = self.attn_backend.name
        self.pp_group = get_pp_group()
        self.is_first_stage, self.is_last_stage = self.pp_group.is_first_rank, self.pp_group.is_last_rank
        # The send to the next stage still under way, with the tensors it reads (kept alive until done).
        self._pending_send: tuple[list, IntermediateTensors] | None = None
        self.model: torch.nn.Module | None = None
        # What a step calls to run the model: the model itself, or what capture_model swaps in.
        self.model_forward: torch.nn.Module | CudaGraphs | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sampler = Sampler(random_draw(self.device, vllm_config.optimization_config))
        # Every request the runner knows, including preempted ones waiting to resume.
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(
            max_num_reqs=vllm_config.scheduler_config.max_num_seqs,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            vocab_size=self.model_config.vocab_size,
            device=self.device,
        )
        self.prompt_logprobs = PromptLogprobs()  # requests whose prompt logprobs are not delivered yet
        self._sampling_rows = np.zeros(0, dtype=np.int64)
        self._arange = np.arange(vllm_config.scheduler_config.max_num_batched_tokens + 1, dtype=np.int64)
        # The step's laps of its host parts (core/stages.py: StepPart) when the engine core asks for
        # them, and on CUDA a pair of events around the forward and the logits, read after the sync.
        self._laps: LapTimer = NO_LAPS
        self._forward_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    # ---- set-up --------------------------------------------------------------------------------

    def load_model(self) -> None:
        config = self.vllm_config.optimization_config
        self.model = load_model(self.model_config.model, self.dtype, self.device, self.attn_backend, config)
        self.model_forward = self.model
        impls = [m.impl for m in self.model.modules() if isinstance(m, Attention)]
        self.attn_metadata_builder = self.attn_backend.get_builder_cls()(impls[0], self.dtype, self.block_size, config)
        choice = self.attn_metadata_builder.describe()
        self.attention_backend = f"{self.attn_backend.name} ({choice})" if choice else self.attn_backend.name
        logger.info("Attention backend: %s", self.attention_backend)

    def kv_cache_spec(self) -> list[tuple[int, int]]:
        """(num_kv_heads, head_dim) of each attention layer this rank holds (its stage's), in layer order."""
        return [(m.num_kv_heads, m.head_dim) for m in self.model.modules() if isinstance(m, Attention)]

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """One (key, value) pair of ``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer of
        ``kv_cache_spec`` (a pipeline stage caches only its own layers)."""
        self.kv_caches = []
        for num_kv_heads, head_dim in self.kv_cache_spec():
            shape = self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, num_kv_heads, head_dim)
            self.kv_caches.append(
                (torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device))
            )
        bind_kv_cache(self.model, self.kv_caches)

    def warm_up(self, num_tokens: int, num_reqs: int = 1) -> int:
        """Dummy requests through the forward pass and the sampler, as a step would run them, so
        that the first real step does not pay one-time costs (allocations, kernel selection; on
        CUDA, compiling the Triton kernels). ``num_reqs`` requests of ``num_tokens`` prompt tokens
        each; of one token each, they take the decode path, each attending to itself. Their KV goes to
        the first blocks, which no request holds yet and no hash names; the batch is empty again
        afterwards. With pipeline stages every stage runs it at once, the dummy's tensors passing
        from stage to stage. ``num_tokens`` and ``num_reqs`` as far as the limits and the KV cache
        allow. Returns the tokens run, all requests together."""
        num_cache_blocks = self.kv_caches[0][0].shape[0]
        num_tokens = min(num_tokens, self.vllm_config.scheduler_config.max_num_batched_tokens, self.max_model_len - 1,
                         num_cache_blocks * self.block_size)
        num_blocks = -(-num_tokens // self.block_size)
        num_reqs = max(1, min(num_reqs, self.vllm_config.scheduler_config.max_num_seqs, num_cache_blocks // num_blocks,
                              self.vllm_config.scheduler_config.max_num_batched_tokens // num_tokens))
        ids = [f"warmup-{i}" for i in range(num_reqs)]
        dummies = [NewRequestData(req_id, list(range(num_tokens)), SamplingParams(temperature=0.0, max_tokens=1), None,
                                  list(range(i * num_blocks, (i + 1) * num_blocks)), 0) for i, req_id in enumerate(ids)]
        run = SchedulerOutput(dummies, CachedRequestData(), dict.fromkeys(ids, num_tokens), num_reqs * num_tokens,
                              set(), set())
        self.sample_tokens(self.execute_model(run))
        self._update_states(SchedulerOutput([], CachedRequestData(), {}, 0, set(), set(ids)))
        return num_reqs * num_tokens

    def capture_model(self) -> list[int]:
        """Optimisation "cuda_graphs": capture the decode forward as CUDA graphs, one per batch size,
        and swap them in as ``model_forward`` (worker/cuda_graphs.py). After the KV cache is bound and
        the warm-up has run. Returns the batch sizes captured: none off CUDA, with the optimisation off
        (``enforce_eager``), with an attention backend that plans on the host, or with several ranks."""
        config = self.vllm_config
        if self.device.type != "cuda" or not config.optimization_config.enabled("cuda_graphs"):
            return []
        if not self.attn_backend.supports_cuda_graphs or config.parallel_config.world_size > 1:
            logger.info("No CUDA graphs: they need an attention backend that supports them (triton; this engine "
                        "runs %s) and a single rank (world size %d here); every step runs eagerly",
                        self.attn_backend.name, config.parallel_config.world_size)
            return []
        graphs = CudaGraphs(self.model, self.attn_metadata_builder, config.scheduler_config.max_num_seqs,
                            self.max_model_len, self.input_batch.block_table.max_num_blocks_per_req, self.device)
        sizes = graphs.capture()
        self.model_forward = graphs
        return sizes

    # ---- one step ------------------------------------------------------------------------------

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.prompt_logprobs.remove(req_id)
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
            if params.prompt_logprobs is not None and self.is_last_stage:
                self.prompt_logprobs.add(new.req_id, params.prompt_logprobs)
            to_add.append(state)

        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            row = batch.req_id_to_index.get(req_id)
            assert not (cached.resumed_from_preemption[i] and row is not None), "a preempted row left the batch"
            if not self.is_last_stage:
                self._append_new_token_ids(state, row, cached.num_computed_tokens[i], cached.new_token_ids[i])
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_block_ids = cached.new_block_ids[i]
            if cached.resumed_from_preemption[i]:
                state.block_ids = list(new_block_ids)
            else:
                state.block_ids.extend(new_block_ids)
            if row is None:
                to_add.append(state)
            else:
                batch.num_computed_tokens_cpu[row] = state.num_computed_tokens
                batch.block_table.append_row(new_block_ids, row)

        batch.condense()
        for state in to_add:
            batch.add_request(state)

    def _append_new_token_ids(self, state: CachedRequestState, row: int | None, start: int,
                              new_token_ids: list[int]) -> None:
        """A stage that does not sample learns the sampled tokens here: ``new_token_ids`` are the
        tokens at positions ``start ..`` that the request computes this step, and those beyond what
        the stage knows (the token sampled since it last ran the request) go to its output tokens
        and, when it has one, its batch row (a row added later, after a preemption, copies them from
        the state)."""
        assert start <= state.num_tokens, "a token the stage never saw would be missing"
        for token_id in new_token_ids[state.num_tokens - start:]:
            if row is None:
                state.output_token_ids.append(token_id)
            else:
                self.input_batch.append_token(row, token_id)

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
        self._laps.lap(StepPart.PREPARE_INPUTS)

        dev = self.device
        attn_metadata = self.attn_metadata_builder.build(AttentionMetadata(
            num_actual_tokens=total,
            max_query_len=int(num_scheduled.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=torch.from_numpy(query_start_loc).to(dev),
            seq_lens=torch.from_numpy(seq_lens).to(dev),
            block_table=batch.block_table.get_device_tensor(num_reqs, dev),
            slot_mapping=torch.from_numpy(slot_mapping).to(dev),
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
        ))
        inputs = (
            torch.from_numpy(input_ids).to(dev),
            torch.from_numpy(positions).to(dev),
            attn_metadata,
            torch.from_numpy(logits_indices).to(dev),
        )
        self._laps.lap(StepPart.COPY_INPUTS)
        return inputs

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Steps 1-3 above: the batch brought up to date, its inputs built, the model run (from the
        previous pipeline stage's hidden states after the first), and the logits of the rows that
        sample (a stage before the last hands its hidden states on instead)."""
        laps = self._laps = LapTimer() if scheduler_output.time_step_parts else NO_LAPS
        self._update_states(scheduler_output)
        laps.lap(StepPart.UPDATE_STATES)
        req_ids = list(self.input_batch.req_ids[: self.input_batch.num_reqs])
        if scheduler_output.total_num_scheduled_tokens == 0:
            return self._no_logits(req_ids)
        input_ids, positions, attn_metadata, logits_indices = self._prepare_inputs(scheduler_output)
        self._start_device_timer()
        from_previous_stage = self._recv_intermediate_tensors(scheduler_output.total_num_scheduled_tokens)
        hidden_states = self.model_forward(input_ids, positions, attn_metadata, from_previous_stage)
        laps.lap(StepPart.FORWARD)
        if not self.is_last_stage:
            self._send_intermediate_tensors(hidden_states)
            return self._no_logits(req_ids)
        logits = self.model.compute_logits(hidden_states[logits_indices])
        self._stop_device_timer()
        prompt_logprobs_dict = {}
        if self.prompt_logprobs:
            prompt_logprobs_dict = self.prompt_logprobs.compute(hidden_states, attn_metadata.query_start_loc_cpu,
                                                                self.input_batch, self.requests, self.model,
                                                                self.sampler)
        laps.lap(StepPart.COMPUTE_LOGITS)
        return ModelRunnerOutput(
            req_ids=req_ids,
            sampling_req_ids=[req_ids[r] for r in self._sampling_rows],
            logits=logits,
            prompt_logprobs_dict=prompt_logprobs_dict,
            step_parts=laps.durations,
        )

    def _no_logits(self, req_ids: list[str]) -> ModelRunnerOutput:
        """A step with nothing to sample here: no tokens scheduled, or a stage before the last."""
        self._sampling_rows = np.zeros(0, dtype=np.int64)
        return ModelRunnerOutput(req_ids, [], None, step_parts=self._laps.durations)

    def _start_device_timer(self) -> None:
        if self._laps.timing and self.device.type == "cuda":
            self._forward_events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._forward_events[0].record()

    def _stop_device_timer(self) -> None:
        if self._forward_events is not None:
            self._forward_events[1].record()

    def _recv_intermediate_tensors(self, num_tokens: int) -> IntermediateTensors | None:
        """The previous stage's residual stream for this step's ``num_tokens`` tokens, in the order
        ``_send_intermediate_tensors`` sends it; None on the first stage (it starts from token ids)."""
        if self.is_first_stage:
            return None
        shape = (num_tokens, self.model_config.hf_config.hidden_size)
        hidden_states = self.pp_group.recv_from_prev(shape, self.dtype, self.device)
        residual = self.pp_group.recv_from_prev(shape, self.dtype, self.device)
        return IntermediateTensors(hidden_states, residual)

    def _send_intermediate_tensors(self, tensors: IntermediateTensors) -> None:
        """Start sending to the next stage, and return while the bytes travel: the next batch's
        forward overlaps the next stage's work on this one. Only the previous send is waited for
        first, so at most one is under way, and its tensors stay alive until it is done."""
        if self._pending_send is not None:
            with COMM_CLOCK.timing("send_s"):
                for work in self._pending_send[0]:
                    work.wait()
        works = [self.pp_group.isend_to_next(t) for t in (tensors.hidden_states, tensors.residual)]
        self._pending_send = (works, tensors)

    @torch.inference_mode()
    def sample_tokens(self, model_runner_output: ModelRunnerOutput) -> SamplerOutput:
        rows = self._sampling_rows
        forward_events, self._forward_events = self._forward_events, None
        if len(rows) == 0:
            return SamplerOutput(torch.zeros(0, dtype=torch.int64), None)
        laps = LapTimer() if self._laps.timing else NO_LAPS
        metadata = self.input_batch.make_sampling_metadata(rows)
        output = self.sampler(model_runner_output.logits, metadata)
        assert output.failed is not None, "the Sampler marks the failed rows"
        laps.lap(StepPart.SAMPLER)
        # The ids and the failed rows in one copy: the step's one device-to-host sync.
        sampled, failed = torch.stack((output.sampled_token_ids, output.failed.long())).cpu()
        logprobs = output.logprobs_tensors
        if logprobs is not None:
            logprobs.logprob_token_ids = logprobs.logprob_token_ids.cpu()
            logprobs.logprobs = logprobs.logprobs.cpu()
            logprobs.selected_token_ranks = logprobs.selected_token_ranks.cpu()
        # The sync has passed both events: reading them waits for nothing.
        forward_device_s = forward_events[0].elapsed_time(forward_events[1]) / 1e3 if forward_events else None
        laps.lap(StepPart.DEVICE_SYNC)
        # A failed row's id (0) is appended too; its request is finished and its row removed next step.
        for row, token_id in zip(rows.tolist(), sampled.tolist()):
            self.input_batch.append_token(row, token_id)
        laps.lap(StepPart.APPEND_TOKENS)
        return SamplerOutput(sampled, logprobs, failed.bool(), laps.durations, forward_device_s)
