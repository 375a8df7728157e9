"""The replay itself: the engine core's own ``step()`` over a simulated executor, and the front end's
own output processing and tracers, on a simulated clock.

A discrete-event loop. Nothing waits: the clock jumps to the next thing that happens::

    WhatIfRun.run()
      idle?  the clock jumps to the next request handed over (at first: ArrivalPlan.first_queued)
      the requests handed over by now ─▶ RequestTracer.request_added, OutputProcessor.add_request,
                                         EngineCore.add_request (queued now)
      the busy loop's turn: the clock moves by the recorded gap between steps (at first: to first_step)
      EngineCore.step()               schedule → execute_model → sample → update_from_output,
                                      the real Scheduler and KVCacheManager; the simulated worker moves
                                      the clock by the step-cost model's prediction (pace.py)
      OutputProcessor.process_outputs (at the step's end + the output delay) ─▶ RequestTracer.requests_finished

What the engine records goes to the real observers: ``EngineCoreTracer`` hears the scheduler's and
the KV cache manager's events and the steps' records, ``RequestTracer`` draws ``llm_request`` from the
front end's own stats. So the predicted trace is a trace like any other, with the recorded request ids,
which ``viz``, ``traces check``, ``traces explain`` and the Jaeger export read as they are.

A request ends as it ended in the run: at its stop token, at ``max_tokens``, or, if the client
aborted it (or the trace ended first), aborted once it has its recorded output.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tracevllm.config import ObservabilityConfig
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.sched.async_scheduler import AsyncScheduler
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.core.stages import Phase
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.core import EngineCore
from tracevllm.engine.output_processor import OutputProcessor, ParentRequest
from tracevllm.executor.simulated_executor import STOP_TOKEN_ID, RecordedOutput, SimulatedExecutor, SimulatedWorker
from tracevllm.metrics.stats import IterationStats
from tracevllm.sampling_params import RequestOutputKind, SamplingParams
from tracevllm.tracing import flush_traces, make_engine_observers
from tracevllm.tracing.request_tracer import RequestTracer
from tracevllm.tracing.schema import SpanName
from tracevllm.whatif.arrivals import Arrival, ArrivalPlan
from tracevllm.whatif.config import SimulationConfig
from tracevllm.whatif.pace import Pace
from viz.trace_loader import cyclic_gc_paused
from viz.workload import stand_in_prompts

# The exporter's queue holds 2048 spans, and the replay makes them faster than it drains: the files
# are completed every so many steps or finished requests.
FLUSH_EVERY_STEPS = 32
FLUSH_EVERY_REQUESTS = 128
# The busy loop takes time to queue a request, and between queueing requests and stepping, however fast it is:
# a microsecond each, so that the trace keeps the order it did them in.
MIN_TURN_S = 1e-6


class SimulatedClock:
    """The replay's time, in seconds since the epoch as ``time.time()``: it moves only when told."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def simulated_engine_core(config: SimulationConfig, executor: SimulatedExecutor, recorder: EventRecorder) -> EngineCore:
    """The engine core of a run under ``config``, with no model: the start-up recorded as that run
    recorded it (the KV cache is a number of blocks: nothing to load, allocate or warm up), then
    ``EngineCore``'s own constructor over the real ``Scheduler`` and ``executor``."""
    attributes = config.attributes()
    with recorder.phase(Phase.ENGINE_CORE_INIT, attributes[SpanName.ENGINE_CORE_INIT]):
        with recorder.phase(Phase.ALLOCATE_KV_CACHE, attributes[SpanName.ALLOCATE_KV_CACHE]):
            pass
        scheduler_cls = AsyncScheduler if config.scheduler.async_scheduling else Scheduler
        scheduler = scheduler_cls(config.scheduler, config.cache, recorder)
    return EngineCore(scheduler, executor, recorder)


@dataclass(frozen=True, slots=True)
class PredictedRequest:
    """A replayed engine-core request as the front end timed it, in seconds since the epoch's time 0."""

    request_id: str
    arrival: float
    first_token: float | None
    finished: float
    num_output_tokens: int
    num_preemptions: int

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finished - self.arrival


class WhatIfRun:
    """One replay of ``plan`` under ``config``, timed by ``pace``, traced as ``observability`` says. Times in
    the plan are seconds after ``epoch`` (the recorded trace's time 0, so the two traces line up)."""

    def __init__(self, plan: ArrivalPlan, config: SimulationConfig, pace: Pace, observability: ObservabilityConfig,
                 epoch: float, model_name: str) -> None:
        self.plan, self.pace, self.epoch = plan, pace, epoch
        self.clock = SimulatedClock(epoch + min(a.arrival for a in plan.arrivals))
        self.front_end_clock = SimulatedClock(self.clock.now)
        self.recorder = EventRecorder(make_engine_observers(observability), clock=self.clock)
        self.request_tracer = RequestTracer(observability, model_name, None, clock=self.front_end_clock)
        self.output_processor = OutputProcessor(tokenizer=None)  # no text: the requests do not detokenize
        samples = [r for a in plan.arrivals for r in a.samples]
        self.prompts = stand_in_prompts(samples)
        outputs = {r.request_id: RecordedOutput(r.num_output_tokens, r.finish_reason == "stop") for r in samples}
        # Aborted by the client (or cut by the trace's end): aborted again once they have their output.
        self.to_abort = {r.request_id: (r.parent_request_id, r.num_output_tokens) for r in samples
                         if r.finish_reason not in ("stop", "length")}
        worker = SimulatedWorker(outputs, pace.step_seconds, self.clock.advance)
        executor = SimulatedExecutor(worker, config.scheduler.async_scheduling)
        self.engine_core = simulated_engine_core(config, executor, self.recorder)
        self.predicted: list[PredictedRequest] = []
        self._unflushed_steps = self._unflushed_requests = 0

    def run(self) -> list[PredictedRequest]:
        """Replay every arrival until the engine has nothing left; the trace files are complete on return.

        The cyclic garbage collector waits until the end: the replay makes hundreds of thousands of
        spans, events and records with hardly a cycle among them, and walking them at every
        threshold took a tenth of a 200-request replay."""
        with cyclic_gc_paused():
            return self._run()

    def _run(self) -> list[PredictedRequest]:
        pending = deque(self.plan.arrivals)
        self.clock.now = max(self.clock.now, self.epoch + self.plan.first_queued)
        turn = self.plan.first_step - self.plan.first_queued  # before the first step: as recorded
        while pending or self.engine_core.has_unfinished_requests():
            if not self.engine_core.has_unfinished_requests():  # idle: until the next request is handed over
                self.clock.now = max(self.clock.now, self.epoch + pending[0].queued)
            while pending and self.epoch + pending[0].queued <= self.clock.now:
                self.clock.advance(MIN_TURN_S)
                self._submit(pending.popleft())
            self.clock.advance(max(turn, MIN_TURN_S))  # the busy loop's turn: outputs out, inputs in
            self._step()
            turn = self.pace.gap_s
        flush_traces()
        return self.predicted

    def _submit(self, arrival: Arrival) -> None:
        """Hand a user request to the engine core, as ``LLMEngine.add_processed_request`` does; its
        ``tokenize`` span ends when it was queued in the run (it may have waited for this step)."""
        self.front_end_clock.now = self.epoch + arrival.queued
        first = arrival.samples[0]
        params = SamplingParams(
            n=len(arrival.samples), max_tokens=first.max_tokens, min_tokens=first.min_tokens,
            ignore_eos=first.ignore_eos, stop_token_ids=[STOP_TOKEN_ID], detokenize=False,
            prompt_logprobs=0 if first.prompt_logprobs else None, output_kind=RequestOutputKind.FINAL_ONLY)
        prompt = self.prompts[first.request_id]
        parent = ParentRequest(arrival.request_id, None, prompt, params, self.epoch + arrival.arrival)
        children = [EngineCoreRequest(r.request_id, prompt, params.clone(n=1), STOP_TOKEN_ID,
                                      self.epoch + arrival.arrival, r.priority) for r in arrival.samples]
        self.request_tracer.request_added(parent, children, None)
        for index, request in enumerate(children):
            self.output_processor.add_request(request, parent, index)
            self.engine_core.add_request(request)

    def _step(self) -> None:
        """One call of the engine core's step, as the busy loop makes it; a call that only put a batch
        in flight (asynchronous scheduling) has no outputs yet."""
        if (outputs := self.engine_core.step_fn()) is None:
            return
        self.front_end_clock.now = self.clock.now + self.pace.output_delay_s
        processed = self.output_processor.process_outputs(outputs.outputs, IterationStats(self.front_end_clock.now))
        finished = list(processed.finished_requests)
        for output in outputs.outputs:
            parent_id, num_tokens = self.to_abort.get(output.request_id, (None, 0))
            state = self.output_processor.request_states.get(output.request_id)
            if parent_id is not None and state is not None and len(state.detokenizer.token_ids) >= num_tokens:
                to_abort, aborted = self.output_processor.abort_requests([parent_id], self.front_end_clock.now)
                self.engine_core.abort_requests(to_abort)
                finished += aborted
        self.request_tracer.requests_finished(finished)
        self._keep(finished)

    def _keep(self, finished: list[ParentRequest]) -> None:
        for parent in finished:
            for child in parent.children:
                s = child.stats
                first_token = s.first_token_ts - self.epoch if s.first_token_ts else None
                self.predicted.append(PredictedRequest(child.request_id, parent.arrival_time - self.epoch, first_token,
                                                       s.finished_ts - self.epoch, s.num_generation_tokens,
                                                       s.num_preemptions))
        self._unflushed_steps += 1
        self._unflushed_requests += len(finished)
        if self._unflushed_steps >= FLUSH_EVERY_STEPS or self._unflushed_requests >= FLUSH_EVERY_REQUESTS:
            flush_traces()
            self._unflushed_steps = self._unflushed_requests = 0
