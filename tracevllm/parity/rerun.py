"""A golden schedule's workload, run again through tracevllm's own scheduler and KV cache manager.

The engine core is the what-if's (``simulated_engine_core``: the real ``EngineCore.step()``,
``Scheduler`` and ``KVCacheManager``, no model), its executor a ``SimulatedWorker`` that samples the
tokens vLLM sampled, request by request, so that each request stops where it stopped in vLLM (at a
stop token, EOS, ``max_tokens`` or ``max_model_len``) if the schedule is the same. The front end is
``LLMEngine``'s: the ``OutputProcessor`` (``n`` samples gathered into one request) and, when traced,
the ``RequestTracer``. The driver does what vLLM's did before each step: it adds the requests vLLM's
driver added (``GoldenStep.added``) and aborts those it aborted; an engine left with nothing to do
takes the next arrivals at once. Each step starts when vLLM's started and takes the time vLLM's took
(the golden's clock, on a simulated one here), so a traced replay lines up with vLLM's run. Adding a
request takes the loop a microsecond, as the what-if's does: arrival times then follow submission
order, as vLLM's did (they order the priority queue's ties and the choice of a preemption victim),
and every request is queued before the step that may admit it.

A ``ScheduleLog`` hears the engine's events and writes each step down as the golden's recorder did,
for ``parity/compare.py``::

    golden ─▶ options (+ settings) ─▶ SchedulerConfig, CacheConfig
          └─▶ requests added / aborted before each step ─▶ EngineCore.step() ─▶ events ─▶ ScheduleLog
                                                                                   └─▶ the tracer (trace_out)
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tracevllm.config import CacheConfig, ObservabilityConfig, SchedulerConfig
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.output_processor import OutputProcessor, ParentRequest
from tracevllm.executor.simulated_executor import RecordedOutput, SimulatedExecutor, SimulatedWorker
from tracevllm.metrics.stats import IterationStats
from tracevllm.parity.golden import GoldenRequest, GoldenSchedule, GoldenStep
from tracevllm.parity.schedule_log import ScheduleLog
from tracevllm.sampling_params import RequestOutputKind, SamplingParams
from tracevllm.tracing import flush_traces, make_engine_observers, make_request_tracer
from tracevllm.whatif.config import SimulationConfig
from tracevllm.whatif.engine import MIN_TURN_S, SimulatedClock, simulated_engine_core

# A replay that parts from vLLM's schedule may need more steps than vLLM did: this many times as many, at most.
MAX_STEPS_FACTOR = 4


def simulation_config(options: dict[str, Any]) -> SimulationConfig:
    """The scheduler's and the KV cache's configuration from a golden's options (vLLM's names, which
    are tracevllm's ``EngineArgs`` names), checked as the engine checks its own."""
    o = options
    scheduler = SchedulerConfig(
        max_num_seqs=o["max_num_seqs"], max_num_batched_tokens=o["max_num_batched_tokens"],
        max_model_len=o["max_model_len"], policy=o["scheduling_policy"],
        enable_chunked_prefill=o["enable_chunked_prefill"],
        long_prefill_token_threshold=o["long_prefill_token_threshold"],
        scheduler_reserve_full_isl=o["scheduler_reserve_full_isl"], watermark=o["watermark"],
        # Goldens recorded before vLLM's asynchronous scheduling was recorded too ran without it.
        async_scheduling=o.get("async_scheduling", False))
    cache = CacheConfig(block_size=o["block_size"], enable_prefix_caching=o["enable_prefix_caching"],
                        num_gpu_blocks_override=o["num_gpu_blocks_override"])
    cache.num_gpu_blocks = o["num_gpu_blocks_override"]
    return SimulationConfig(scheduler, cache)


def _params(r: GoldenRequest, n: int) -> SamplingParams:
    return SamplingParams(n=n, max_tokens=r.max_tokens, min_tokens=r.min_tokens, ignore_eos=r.ignore_eos,
                          stop_token_ids=list(r.stop_token_ids), detokenize=False,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def _durations(steps: Sequence[GoldenStep]) -> Iterator[float]:
    """Each step's duration in vLLM's run, then (should the replay need more steps) the median."""
    durations = [max(s.end - s.start, 0.0) for s in steps]
    yield from durations
    median = statistics.median(durations) if durations else 0.0
    while True:
        yield median


class GoldenReplay:
    """One replay of ``golden``'s workload under its options changed by ``settings``; ``run()`` returns
    the steps as ``ScheduleLog`` wrote them down. With ``trace_out``, a trace of it is written there."""

    def __init__(self, golden: GoldenSchedule, settings: dict[str, Any] | None = None,
                 trace_out: str | Path | None = None) -> None:
        self.golden = golden
        config = simulation_config({**golden.options, **(settings or {})})
        observability = ObservabilityConfig(trace_out=str(trace_out) if trace_out else None)
        self.epoch = time.time()
        self.clock = SimulatedClock(self.epoch)
        self.log = ScheduleLog()
        recorder = EventRecorder([self.log, *make_engine_observers(observability)], clock=self.clock)
        durations = _durations(golden.steps)
        outputs = {r.request_id: RecordedOutput(len(r.output_token_ids), r.finish_reason == "stop",
                                                tuple(r.output_token_ids)) for r in golden.requests}
        worker = SimulatedWorker(outputs, lambda *batch: next(durations), self.clock.advance)
        executor = SimulatedExecutor(worker, config.scheduler.async_scheduling)
        self.core = simulated_engine_core(config, executor, recorder)
        self.output_processor = OutputProcessor(tokenizer=None)
        self.request_tracer = make_request_tracer(observability, f"vLLM {golden.vllm_version}: {golden.scenario}",
                                                  None)
        self.requests = golden.request_by_id

    def run(self) -> list[GoldenStep]:
        actions = [(s.added, s.aborted) for s in self.golden.steps]
        next_action, max_steps = 0, MAX_STEPS_FACTOR * len(actions) + 100
        while (next_action < len(actions) or self.core.has_unfinished_requests()) and len(self.log.steps) < max_steps:
            # Before this step, what vLLM's driver did before its step of the same number; an idle engine
            # takes the next arrivals at once, as the recorder's driver did.
            while next_action < len(actions):
                added, aborted = actions[next_action]
                next_action += 1
                self._add(added)
                self._abort(aborted)
                if self.core.has_unfinished_requests():
                    break
            if not self.core.has_unfinished_requests():
                break
            self.clock.advance(MIN_TURN_S)
            if len(self.log.steps) < len(self.golden.steps):
                self.clock.now = max(self.clock.now, self.epoch + self.golden.steps[len(self.log.steps)].start)
            self._step()
        self.log.close_in_flight()
        flush_traces()
        return self.log.steps

    def _parent_id(self, request_id: str) -> str:
        return self.requests[request_id].parent_id or request_id

    def _add(self, request_ids: list[str]) -> None:
        """Hand the requests to the engine core as ``LLMEngine.add_request`` does: the ``n`` samples of
        a request together, under one ``ParentRequest``."""
        for parent_id, samples in itertools.groupby(request_ids, self._parent_id):
            children = [self.requests[r] for r in samples]
            first = children[0]
            params = _params(first, len(children))
            self.clock.advance(MIN_TURN_S)
            arrival = self.clock.now
            parent = ParentRequest(parent_id, None, list(first.prompt_token_ids), params, arrival)
            requests = [EngineCoreRequest(r.request_id, list(r.prompt_token_ids), params.clone(n=1), r.eos_token_id,
                                          arrival, r.priority) for r in children]
            if self.request_tracer is not None:
                self.request_tracer.request_added(parent, requests, None)
            for index, request in enumerate(requests):
                self.output_processor.add_request(request, parent, index)
                self.core.add_request(request)

    def _abort(self, request_ids: list[str]) -> None:
        if not request_ids:
            return
        parents = list(dict.fromkeys(self._parent_id(r) for r in request_ids))
        to_abort, aborted = self.output_processor.abort_requests(parents, self.clock.now)
        self.core.abort_requests(to_abort)
        if self.request_tracer is not None:
            self.request_tracer.requests_finished(aborted)

    def _step(self) -> None:
        if (outputs := self.core.step_fn()) is None:
            return  # a batch went in flight (asynchronous scheduling): its outputs come with a later call
        processed = self.output_processor.process_outputs(outputs.outputs, IterationStats(self.clock.now))
        if self.request_tracer is not None:
            self.request_tracer.requests_finished(list(processed.finished_requests))


def replay(golden: GoldenSchedule, settings: dict[str, Any] | None = None,
           trace_out: str | Path | None = None) -> list[GoldenStep]:
    """Run ``golden``'s workload through tracevllm (``GoldenReplay``); its steps, in the golden's terms."""
    return GoldenReplay(golden, settings, trace_out).run()
