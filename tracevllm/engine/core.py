"""EngineCore: the scheduler and the model executor, stepped together.

``step()`` is the engine's heartbeat: ``schedule -> execute_model -> sample_tokens ->
update_from_output``. With pipeline parallelism, ``step_with_batch_queue()`` replaces it and keeps one
batch in flight per pipeline stage. The front end (LLMEngine / AsyncLLM) talks to it only through
``EngineCoreRequest`` in and ``EngineCoreOutputs`` out, so the same class runs in the caller's
process (InprocClient) or, as ``EngineCoreProc`` (``core_proc.py``), in a background process of its own.
"""

from __future__ import annotations

import logging
import queue
import time
from concurrent.futures import Future

from tracevllm.config import VllmConfig
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import BatchScheduled, EngineIdle
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.core.sched.token_budget import fit_token_budget, measure_step_cost
from tracevllm.core.stages import SCHEDULER_CONFIG_ATTRS, Phase, PhaseAttr, Stage
from tracevllm.engine import EngineCoreOutputs, EngineCoreRequest, FinishReason
from tracevllm.engine.step_profile import profile_steps
from tracevllm.executor.abstract import Executor
from tracevllm.request import Request, RequestStatus
from tracevllm.tracing import make_engine_observers
from tracevllm.worker.outputs import ModelRunnerOutput

logger = logging.getLogger(__name__)

_FINISHED_STATUS = {
    FinishReason.ABORT: RequestStatus.FINISHED_ABORTED, FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
}


class EngineCore:
    """The scheduler and the model executor, stepped together: ``add_request`` queues a request,
    each ``step()`` runs one batch and returns its ``EngineCoreOutputs``.

    Building it loads the model, sizes the KV cache and warms up (the start-up phases its events
    record). ``startup_trace_headers``: the front end's start-up span, handed to the core's observers
    (the tracer makes it the parent of this core's start-up trace)."""

    def __init__(self, vllm_config: VllmConfig, startup_trace_headers: dict[str, str] | None = None) -> None:
        self.vllm_config = vllm_config
        # Everything the core records goes here; observers (tracing) listen, when there are any.
        self.events = EventRecorder(make_engine_observers(vllm_config.observability_config, startup_trace_headers))
        scheduler_config = vllm_config.scheduler_config
        with self.events.phase(Phase.ENGINE_CORE_INIT) as startup:
            start = time.perf_counter()
            logger.info("Loading the model's weights (%s) on %s...", vllm_config.model_config.model, vllm_config.device)
            with self.events.phase(Phase.LOAD_MODEL, {PhaseAttr.MODEL: vllm_config.model_config.model}) as attributes:
                self.model_executor = Executor.get_class(vllm_config)(vllm_config)
                attributes[PhaseAttr.ATTENTION_BACKEND] = self.model_executor.get_attention_backend()
                if vllm_config.device.type == "cpu":
                    attributes[PhaseAttr.CPU_THREADS] = self.model_executor.get_cpu_threads()
            logger.info("Model loaded in %.1f s", time.perf_counter() - start)
            with self.events.phase(Phase.ALLOCATE_KV_CACHE) as attributes:
                self.num_gpu_blocks = self._initialize_kv_caches()
                attributes.update({
                    PhaseAttr.NUM_GPU_BLOCKS: self.num_gpu_blocks,
                    PhaseAttr.BLOCK_SIZE: vllm_config.cache_config.block_size,
                    PhaseAttr.ENABLE_PREFIX_CACHING: vllm_config.cache_config.enable_prefix_caching,
                    PhaseAttr.KV_CACHE_BYTES: self.num_gpu_blocks * self.model_executor.kv_cache_bytes_per_block(),
                })
            start = time.perf_counter()
            logger.info("Warming up: one dummy step, so that the first request pays no one-time costs...")
            with self.events.phase(Phase.WARMUP) as attributes:
                attributes[PhaseAttr.NUM_WARMUP_TOKENS] = self.model_executor.compile_or_warm_up_model()
                logger.info("Warm-up done in %.1f s (%d tokens)", time.perf_counter() - start,
                            attributes[PhaseAttr.NUM_WARMUP_TOKENS])
                if vllm_config.scheduler_config.target_step_seconds is not None:
                    attributes.update(self._fit_token_budget())
            if vllm_config.device.type == "cuda":
                with self.events.phase(Phase.CAPTURE_CUDA_GRAPHS) as attributes:
                    start = time.perf_counter()
                    sizes = self.model_executor.capture_model()
                    attributes[PhaseAttr.CUDA_GRAPH_SIZES] = ",".join(map(str, sizes))
                    if sizes:
                        logger.info("Captured %d CUDA graphs (decode batches of %d-%d) in %.1f s", len(sizes),
                                    sizes[0], sizes[-1], time.perf_counter() - start)
            observability = vllm_config.observability_config
            if observability.tracing_enabled and observability.trace_level == "step":
                with self.events.phase(Phase.PROFILE_STEPS) as attributes:
                    attributes.update(self._profile_steps())
            # What the start-up built or loaded once (the C++ ops): the trace shows each in its phase.
            for cost in self.model_executor.take_one_time_costs():
                self.events.record(cost)
            self.scheduler = Scheduler(vllm_config.scheduler_config, vllm_config.cache_config, self.events,
                                       use_pp=vllm_config.parallel_config.pipeline_parallel_size > 1)
            # The scheduler as built (its budget as fitted): what a what-if replays the run from.
            startup.update({attr: getattr(scheduler_config, name) for attr, name in SCHEDULER_CONFIG_ATTRS.items()})
        # Batches in flight, oldest first, when the executor can run more than one at a time.
        self.batch_queue: queue.Queue[tuple[SchedulerOutput, Future, Future]] | None = None
        self.step_fn = self.step
        if self.model_executor.max_concurrent_batches > 1:
            self.batch_queue = queue.Queue(self.model_executor.max_concurrent_batches)
            self.step_fn = self.step_with_batch_queue

    def _fit_token_budget(self) -> dict[str, float]:
        """Lower ``max_num_batched_tokens`` to what this machine runs in ``target_step_seconds`` a step
        (core/sched/token_budget.py), before the scheduler is built; the attributes for the span."""
        config = self.vllm_config.scheduler_config
        cost = measure_step_cost(self.model_executor.run_dummy_step)
        ceiling = config.max_num_batched_tokens
        config.max_num_batched_tokens = fit_token_budget(cost, config.target_step_seconds, config.max_num_seqs,
                                                         ceiling)
        logger.info("Token budget: max_num_batched_tokens=%d (a step costs %.1f ms + %.2f ms a token here; "
                    "target %.1f s a step, so that streams do not stall; default ceiling %d; "
                    "--max-num-batched-tokens sets it)", config.max_num_batched_tokens, cost.fixed_s * 1e3,
                    cost.per_token_s * 1e3, config.target_step_seconds, ceiling)
        if cost.seconds(config.max_num_seqs) > 2 * config.target_step_seconds:
            logger.warning("A step of max_num_seqs=%d tokens takes about %.1f s here: lower --max-num-seqs for "
                           "shorter gaps between a stream's chunks.", config.max_num_seqs,
                           cost.seconds(config.max_num_seqs))
        return {PhaseAttr.STEP_SECONDS_PER_TOKEN: cost.per_token_s,
                PhaseAttr.MAX_NUM_BATCHED_TOKENS: config.max_num_batched_tokens}

    def _profile_steps(self) -> dict[str, list[int] | list[float]]:
        """Time the step at a ladder of shapes (engine/step_profile.py), for a what-if on this trace;
        the attributes for the span."""
        config, start = self.vllm_config.scheduler_config, time.perf_counter()
        attributes = profile_steps(self.model_executor.run_dummy_step, config.max_num_batched_tokens,
                                   config.max_num_seqs)
        logger.info("Profiled the step at %d shapes in %.1f s, for the what-if (traces whatif)",
                    len(attributes[PhaseAttr.PROFILE_PREFILL_TOKENS]) + len(attributes[PhaseAttr.PROFILE_DECODE_ROWS]),
                    time.perf_counter() - start)
        return attributes

    def _initialize_kv_caches(self) -> int:
        cache_config = self.vllm_config.cache_config
        num_blocks = self.model_executor.determine_num_available_blocks()
        max_model_len = self.vllm_config.model_config.max_model_len
        usable = num_blocks - 1  # block 0 is the null block (core/block_pool.py): it holds no request's KV
        if usable * cache_config.block_size < max_model_len:
            raise ValueError(
                f"The KV cache holds {num_blocks} blocks of {cache_config.block_size} tokens, {usable} of them for "
                f"requests (block 0 is the null block): {usable * cache_config.block_size} tokens, fewer than "
                f"max_model_len ({max_model_len}): lower max_model_len or give the KV cache more blocks or memory."
            )
        self.model_executor.initialize_cache(num_blocks)
        cache_config.num_gpu_blocks = num_blocks
        return num_blocks

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue the request; ValueError if the core refuses it (its id is already in the engine)."""
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the engine.")
        self.scheduler.add_request(Request.from_engine_core_request(request))

    def abort_requests(self, request_ids: list[str], finish_reason: FinishReason = FinishReason.ABORT) -> None:
        """End requests from outside the step: aborted, or (``STOP``) stopped by a stop string the
        front end found, so that the engine core records the real reason."""
        busy = self.scheduler.has_unfinished_requests()
        self.scheduler.finish_requests(request_ids, _FINISHED_STATUS[finish_reason])
        if busy:
            self._record_if_idle()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, sample, and apply the results. ``self.events.step()`` times the
        four stages and records the step's ``StepRecord`` when someone observes; otherwise its laps
        do nothing. ``step.context``: what the observers give the step to carry to the workers;
        ``step.timing``: whether the model runner laps its host parts too (they come back in its
        outputs, across the executor)."""
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(timestamp=time.time())
        with self.events.step() as step:
            scheduler_output = self.scheduler.schedule()
            scheduler_output.step_context = step.context
            scheduler_output.time_step_parts = step.timing
            step.lap(Stage.SCHEDULE)
            model_output = self.model_executor.execute_model(scheduler_output)
            step.lap(Stage.EXECUTE_MODEL, model_output.step_parts)
            self._record_worker_events(model_output)
            sampler_output = self.model_executor.sample_tokens()
            step.lap(Stage.SAMPLE, sampler_output.step_parts)
            step.device_time(sampler_output.forward_device_s)
            outputs = self.scheduler.update_from_output(scheduler_output, model_output, sampler_output)
            step.lap(Stage.UPDATE_FROM_OUTPUT)
        self._record_if_idle()
        return outputs

    def step_with_batch_queue(self) -> EngineCoreOutputs | None:
        """Pipeline parallelism: while a batch runs in stage 2, the next one can run in stage 1.

        Each call does one of two things. While the queue has room and the scheduler finds work,
        schedule a batch, send it to the workers without waiting (``non_block``: Futures), queue it
        and return None, so the caller calls again at once. Otherwise (queue full, or nothing left to
        schedule because every running request is in flight) wait for the oldest batch and apply
        its output. A request in flight is not scheduled again (``Scheduler.schedule`` skips a
        request whose tokens are all computed or in flight). The events record one engine step per
        call: a scheduling step has a ``schedule`` stage; a completing step has ``execute_model``
        (the wait for the oldest batch), ``sample`` and ``update_from_output``.
        """
        assert self.batch_queue is not None
        if not self.scheduler.has_unfinished_requests() and self.batch_queue.empty():
            return EngineCoreOutputs(timestamp=time.time())
        with self.events.step() as step:
            if not self.batch_queue.full():
                scheduler_output = self.scheduler.schedule()
                scheduler_output.step_context = step.context
                step.lap(Stage.SCHEDULE)
                # A batch with no tokens still goes to the workers when it tells them of finished or
                # preempted requests (their rows must go).
                if (scheduler_output.total_num_scheduled_tokens > 0 or scheduler_output.finished_req_ids
                        or scheduler_output.preempted_req_ids):
                    exec_future = self.model_executor.execute_model(scheduler_output, non_block=True)
                    sample_future = self.model_executor.sample_tokens(non_block=True)
                    self.batch_queue.put_nowait((scheduler_output, exec_future, sample_future))
                    self.scheduler.hold_step_gauges()
                    return None
                if self.batch_queue.empty():
                    return EngineCoreOutputs(scheduler_stats=self.scheduler.make_stats(), timestamp=time.time())
            elif self.events.enabled:  # this step schedules nothing: it only completes a batch
                self.events.hold_for_step(BatchScheduled([], [], self.scheduler.max_num_batched_tokens, 0))
            scheduler_output, exec_future, sample_future = self.batch_queue.get_nowait()
            model_output = exec_future.result()
            step.lap(Stage.EXECUTE_MODEL)
            self._record_worker_events(model_output)
            sampler_output = sample_future.result()
            step.lap(Stage.SAMPLE)
            outputs = self.scheduler.update_from_output(scheduler_output, model_output, sampler_output)
            step.lap(Stage.UPDATE_FROM_OUTPUT)
        self._record_if_idle()
        return outputs

    def _record_worker_events(self, model_output: ModelRunnerOutput) -> None:
        """What the forward paid once (a torch.compile), and a probe of the CPU thread count, recorded
        inside the step that paid for them."""
        for cost in model_output.one_time_costs:
            self.events.record(cost)
        if model_output.cpu_threads_probe is not None:
            self.events.record(model_output.cpu_threads_probe)

    def _record_if_idle(self) -> None:
        """After a step or aborts that left no unfinished request, record ``EngineIdle``, here and in
        every worker (each has observers of its own), before the step's outputs leave. A batch still
        in flight is covered too: the calls to the workers run in order."""
        if self.events.enabled and not self.scheduler.has_unfinished_requests():
            self.events.record(EngineIdle(self.events.now()))
            self.model_executor.collective_rpc("record_engine_idle")

    def shutdown(self) -> None:
        """Stop the workers. The core's observers hear ``EngineIdle`` first: nothing is left to do
        (the workers complete their own output as they exit)."""
        if self.events.enabled:
            self.events.record(EngineIdle(self.events.now(), shutdown=True))
        self.model_executor.shutdown()
