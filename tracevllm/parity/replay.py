"""A golden schedule's workload, run again through tracevllm's own scheduler and KV cache manager.

The engine core is the what-if's (``SimulatedEngineCore``: the real ``EngineCore.step()``,
``Scheduler`` and ``KVCacheManager``, no model), its executor a ``SimulatedWorker`` that samples the
tokens vLLM sampled, request by request, so that each request stops where it stopped in vLLM (at a
stop token, EOS, ``max_tokens`` or ``max_model_len``) if the schedule is the same. The driver does
what the recorder did before each step: it adds the requests vLLM's driver added (``GoldenStep.added``)
and aborts those it aborted; an engine left with nothing to do takes the next arrivals at once. Each
step takes the time vLLM's did (the golden's clock), so a traced replay lines up with vLLM's run.

A ``ScheduleLog`` hears the engine's events and writes each step down as the golden's recorder did,
for ``parity/compare.py``::

    golden ─▶ options (+ settings) ─▶ SchedulerConfig, CacheConfig
          └─▶ requests, added / aborted before each step ─▶ EngineCore.step() ─▶ events ─▶ ScheduleLog
                                                                                     └─▶ the tracer (--trace-out)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.core.event_recorder import EngineObserver, EventRecorder
from tracevllm.engine import EngineCoreRequest
from tracevllm.executor.simulated_executor import RecordedOutput, SimulatedExecutor, SimulatedWorker
from tracevllm.parity.golden import GoldenRequest, GoldenSchedule, GoldenStep
from tracevllm.parity.schedule_log import ScheduleLog
from tracevllm.sampling_params import SamplingParams
from tracevllm.whatif.config import ReplayConfig
from tracevllm.whatif.engine import SimulatedClock, SimulatedEngineCore

# A replay that parts from vLLM's schedule may need more steps than vLLM did: this many times as many, at most.
MAX_STEPS_FACTOR = 4


def replay_config(options: dict[str, Any]) -> ReplayConfig:
    """The scheduler's and the KV cache's configuration from a golden's options (vLLM's names, which
    are tracevllm's ``EngineArgs`` names), checked as the engine checks its own."""
    o = options
    scheduler = SchedulerConfig(
        max_num_seqs=o["max_num_seqs"], max_num_batched_tokens=o["max_num_batched_tokens"],
        max_model_len=o["max_model_len"], policy=o["scheduling_policy"],
        enable_chunked_prefill=o["enable_chunked_prefill"],
        long_prefill_token_threshold=o["long_prefill_token_threshold"],
        scheduler_reserve_full_isl=o["scheduler_reserve_full_isl"], watermark=o["watermark"])
    cache = CacheConfig(block_size=o["block_size"], enable_prefix_caching=o["enable_prefix_caching"],
                        num_gpu_blocks_override=o["num_gpu_blocks_override"])
    cache.num_gpu_blocks = o["num_gpu_blocks_override"]
    return ReplayConfig(scheduler, cache)


def engine_core_request(r: GoldenRequest) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=r.max_tokens, min_tokens=r.min_tokens, ignore_eos=r.ignore_eos,
                            stop_token_ids=list(r.stop_token_ids), detokenize=False)
    return EngineCoreRequest(r.request_id, list(r.prompt_token_ids), params, r.eos_token_id, r.arrival_time,
                             r.priority)


def _durations(steps: Sequence[GoldenStep]) -> Iterator[float]:
    """Each step's duration in vLLM's run, then (should the replay need more steps) the median."""
    durations = [max(s.end - s.start, 0.0) for s in steps]
    yield from durations
    median = statistics.median(durations) if durations else 0.0
    while True:
        yield median


def replay(golden: GoldenSchedule, settings: dict[str, Any] | None = None,
           observers: Sequence[EngineObserver] = ()) -> list[GoldenStep]:
    """Run ``golden``'s workload through tracevllm under its options changed by ``settings``; the steps
    as ``ScheduleLog`` wrote them down. ``observers`` hear the engine's events too (a tracer)."""
    config = replay_config({**golden.options, **(settings or {})})
    clock = SimulatedClock(time.time())
    log = ScheduleLog()
    events = EventRecorder([log, *observers], clock=clock)
    durations = _durations(golden.steps)
    outputs = {r.request_id: RecordedOutput(len(r.output_token_ids), r.finish_reason == "stop",
                                            tuple(r.output_token_ids)) for r in golden.requests}
    worker = SimulatedWorker(outputs, lambda *batch: next(durations), clock.advance)
    core = SimulatedEngineCore(config, SimulatedExecutor(worker), events)
    requests = {r.request_id: r for r in golden.requests}
    actions = [(s.added, s.aborted) for s in golden.steps]
    next_action, max_steps = 0, MAX_STEPS_FACTOR * len(golden.steps) + 100
    while (next_action < len(actions) or core.has_unfinished_requests()) and len(log.steps) < max_steps:
        # Before this step, what vLLM's driver did before its step of the same number; an idle engine
        # takes the next arrivals at once, as the recorder's driver did.
        while next_action < len(actions):
            added, aborted = actions[next_action]
            next_action += 1
            for request_id in added:
                core.add_request(engine_core_request(requests[request_id]))
            if aborted:
                core.abort_requests(list(aborted))
            if core.has_unfinished_requests():
                break
        if not core.has_unfinished_requests():
            break
        core.step()
    return log.steps
