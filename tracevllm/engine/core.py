"""EngineCore: the scheduler and the model executor, stepped together.

``step()`` is the engine's heartbeat: ``schedule -> execute_model -> sample_tokens ->
update_from_output``. With pipeline parallelism or asynchronous scheduling, ``step_with_batch_queue()``
replaces it and keeps more than one batch in flight: one per pipeline stage, or two. The front end
(LLMEngine / AsyncLLM) talks to it only through ``EngineCoreRequest`` in and ``EngineCoreOutputs`` out,
so the same class runs in the caller's process (InprocClient) or, as ``EngineCoreProc``
(``core_proc.py``), in a background process of its own.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from typing import Self

from tracevllm.config import VllmConfig
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import BatchScheduled, EngineIdle
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.core.stages import Stage
from tracevllm.engine import EngineCoreOutputs, EngineCoreRequest, FinishReason
from tracevllm.engine.startup import start_up
from tracevllm.executor.abstract import Executor
from tracevllm.model_runner_output import ModelRunnerOutput
from tracevllm.request import Request, RequestStatus

_FINISHED_STATUS = {
    FinishReason.ABORT: RequestStatus.FINISHED_ABORTED, FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
}


class EngineCore:
    """The scheduler and the model executor, stepped together: ``add_request`` queues a request,
    each ``step()`` runs one batch and returns its ``EngineCoreOutputs``. ``recorder``: where the
    scheduler, the KV cache and the step record their events (observers, such as the tracer, listen).

    The constructor builds nothing. ``from_config`` builds the parts first (``startup.py``: load the
    model, size the KV cache, warm up); the what-if hands it a scheduler over a simulated executor."""

    def __init__(self, scheduler: Scheduler, model_executor: Executor, recorder: EventRecorder) -> None:
        self.scheduler = scheduler
        self.model_executor = model_executor
        self.recorder = recorder
        # Batches in flight, newest first, when more than one may be (pipeline stages, async scheduling).
        self.batch_queue_size = model_executor.max_concurrent_batches
        self.batch_queue: deque[tuple[SchedulerOutput, Future, Future]] | None = None
        self.step_fn = self.step
        if self.batch_queue_size > 1:
            self.batch_queue = deque(maxlen=self.batch_queue_size)
            self.step_fn = self.step_with_batch_queue

    @classmethod
    def from_config(cls, vllm_config: VllmConfig, startup_trace_headers: dict[str, str] | None = None,
                    **kwargs) -> Self:
        """Start up from ``vllm_config`` (``startup.py``), then build the core (``kwargs``: a
        subclass's own arguments)."""
        parts = start_up(vllm_config, startup_trace_headers)
        return cls(parts.scheduler, parts.model_executor, parts.recorder, **kwargs)

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
        """Schedule, run the model, sample, and apply the results. ``self.recorder.step()`` times the
        four stages and records the step's ``StepRecord`` when someone observes; otherwise its laps
        do nothing. ``step.context``: what the observers give the step to carry to the workers;
        ``step.timing``: whether the model runner laps its host parts too (they come back in its
        outputs, across the executor)."""
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(timestamp=time.time())
        with self.recorder.step() as step:
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
        """Several batches in flight: while one runs, the next is scheduled (vLLM's own loop).

        Each call first schedules a batch, if the scheduler has requests (or finished ones to tell the
        workers of), and sends it to the workers without waiting (``non_block``: Futures). If the
        queue still has room and there is more to do, it returns None at once: the caller calls again.
        Otherwise it waits for the oldest batch and applies its output. The queue holds one batch per
        pipeline stage, or two with asynchronous scheduling (``AsyncScheduler``: the next step is
        scheduled before this one's tokens are back). A request whose sampled token is in flight is
        not scheduled again (``Scheduler._num_new_tokens``), except as an output placeholder.

        The events record one engine step per call: ``schedule`` (when it schedules), ``execute_model``
        (handing the batch over, and in one process its forward and sampling; in a call that completes
        a batch, until the oldest batch's model output is back), then ``sample`` and
        ``update_from_output`` of the oldest batch when the call completes one. A call's batch is the
        one it scheduled; the outputs it returns are the oldest batch's.
        """
        batch_queue = self.batch_queue
        assert batch_queue is not None and len(batch_queue) < self.batch_queue_size
        if not self.scheduler.has_requests() and not batch_queue:
            return EngineCoreOutputs(timestamp=time.time())
        with self.recorder.step() as step:
            if self.scheduler.has_requests():
                scheduler_output = self.scheduler.schedule()
                scheduler_output.step_context = step.context
                step.lap(Stage.SCHEDULE)
                exec_future = self.model_executor.execute_model(scheduler_output, non_block=True)
                if exec_future.done() and exec_future.exception() is None:  # it ran in this process, now
                    self._record_worker_events(exec_future.result())
                sample_future = self.model_executor.sample_tokens(non_block=True)
                batch_queue.appendleft((scheduler_output, exec_future, sample_future))
                model_executed = scheduler_output.total_num_scheduled_tokens > 0
                if len(batch_queue) < self.batch_queue_size and (model_executed or self.scheduler.has_requests()):
                    step.lap(Stage.EXECUTE_MODEL)
                    self.scheduler.hold_step_gauges()
                    return None
            elif self.recorder.enabled:  # this call schedules nothing: it only completes a batch
                self.recorder.hold_for_step(BatchScheduled([], [], self.scheduler.max_num_batched_tokens, 0))
            scheduler_output, exec_future, sample_future = batch_queue.pop()
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
        inside the step that paid for them: with a batch queue, the call that ran the forward when it
        ran in this process (its Future is done as it is handed over), else the call that waits for it.
        Recorded once: the output keeps them no longer."""
        for cost in model_output.one_time_costs:
            self.recorder.record(cost)
        if model_output.cpu_threads_probe is not None:
            self.recorder.record(model_output.cpu_threads_probe)
        model_output.one_time_costs, model_output.cpu_threads_probe = [], None

    def _record_if_idle(self) -> None:
        """After a step or aborts that left no unfinished request, record ``EngineIdle``, here and in
        every worker (each has observers of its own), before the step's outputs leave. A batch still
        in flight is covered too: the calls to the workers run in order."""
        if self.recorder.enabled and not self.scheduler.has_unfinished_requests():
            self.recorder.record(EngineIdle(self.recorder.now()))
            self.model_executor.collective_rpc("record_engine_idle")

    def shutdown(self) -> None:
        """Stop the workers. The core's observers hear ``EngineIdle`` first: nothing is left to do
        (the workers complete their own output as they exit)."""
        if self.recorder.enabled:
            self.recorder.record(EngineIdle(self.recorder.now(), shutdown=True))
        self.model_executor.shutdown()
