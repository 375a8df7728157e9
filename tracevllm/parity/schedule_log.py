"""ScheduleLog: a tracevllm run's schedule in a golden's terms, heard from the engine's own events.

An observer of the engine core's ``EventRecorder`` (``core/event_recorder.py``), like the tracer. Each
step becomes a ``GoldenStep`` (``parity/golden.py``), the record ``tests/parity/record_vllm.py`` makes of
vLLM's scheduler, so that the two compare field by field::

    RequestQueued, aborts ──────────────▶ added, aborted     (before the step: the workload)
    StepStarted                           an engine-core call opens
      RequestScheduled / RequestResumed ─▶ admitted, with the prefix-cache hit; all its blocks are new
      BlocksAllocated ────────────────────▶ new_block_ids of a running request
      RequestPreempted ───────────────────▶ preempted, in order (its new blocks of this step go back)
      RequestFinished ────────────────────▶ finished, with the reason
    StepRecord                            the call closes: if it scheduled (its ``schedule`` stage), a
                                          step opens with its batch (who ran, with how many tokens,
                                          computed before); if it applied an output (its
                                          ``update_from_output`` stage), the oldest open step closes,
                                          with what finished and the free blocks after it

One call schedules a step and applies its output in the synchronous loop (``EngineCore.step``). With
asynchronous scheduling a call schedules step N + 1 and then applies step N's output
(``EngineCore.step_with_batch_queue``): the admissions and preemptions are the new step's, the finishes
the old one's. A step still in flight when the run ends (``close_in_flight``) finishes nothing.

Nothing here reads the scheduler itself: what the log holds is what the events say, so a replay
that matches vLLM also checks that the events tell the truth.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tracevllm.core.events import (
    BlocksAllocated, EngineEvent, RequestFinished, RequestPreempted, RequestQueued, RequestResumed, RequestScheduled,
    StepRecord, StepStarted,
)
from tracevllm.core.stages import Stage
from tracevllm.parity.golden import Admission, GoldenStep


class ScheduleLog:
    """Hears a run's events and keeps its steps (``steps``), each as a golden step. ``t0``: the first
    step's start, from which the steps' ``start`` and ``end`` count."""

    def __init__(self) -> None:
        self.steps: list[GoldenStep] = []
        self.t0: float | None = None
        self._in_flight: deque[dict[str, Any]] = deque()  # steps scheduled, their outputs not applied yet
        self._num_scheduled = 0
        self._num_free_blocks = 0  # after the last output applied
        self._added: list[str] = []
        self._aborted: list[str] = []
        self._open = False
        self._admitted: list[Admission] = []
        self._preempted: list[str] = []
        self._new_blocks: dict[str, list[int]] = {}
        self._finished: dict[str, str] = {}

    def on_event(self, event: EngineEvent) -> None:
        if isinstance(event, RequestQueued):
            self._added.append(event.request_id)
        elif isinstance(event, StepStarted):
            self._open = True
            self.t0 = event.start_time if self.t0 is None else self.t0
        elif isinstance(event, RequestFinished) and not self._open:
            if event.finish_reason == "abort":
                self._aborted.append(event.request_id)
        elif not self._open:
            return
        elif isinstance(event, RequestScheduled):  # RequestResumed too
            self._admitted.append(Admission(event.request_id, event.num_computed_tokens,
                                            isinstance(event, RequestResumed)))
            self._new_blocks[event.request_id] = [*event.cached_block_ids, *event.block_ids]
        elif isinstance(event, BlocksAllocated):
            if not any(a.request_id == event.request_id for a in self._admitted):
                self._new_blocks.setdefault(event.request_id, []).extend(event.block_ids)
        elif isinstance(event, RequestPreempted):
            self._preempted.append(event.request_id)
            self._new_blocks.pop(event.request_id, None)
        elif isinstance(event, RequestFinished):
            self._finished[event.request_id] = event.finish_reason
        elif isinstance(event, StepRecord):
            self._close(event)

    def _close(self, record: StepRecord) -> None:
        assert self.t0 is not None
        if Stage.SCHEDULE in record.durations:
            assert record.batch is not None
            scheduled = {r.request_id: r.num_tokens for r in record.batch.scheduled}
            self._num_scheduled += 1
            self._in_flight.append(dict(
                number=self._num_scheduled, scheduled=scheduled,
                num_computed_tokens={r.request_id: r.num_computed_tokens for r in record.batch.scheduled},
                admitted=self._admitted, preempted=self._preempted,
                new_block_ids={r: ids for r, ids in self._new_blocks.items() if r in scheduled and ids},
                added=self._added, aborted=self._aborted, start=record.start_time - self.t0))
            self._added, self._aborted, self._admitted, self._preempted, self._new_blocks = [], [], [], [], {}
        if Stage.UPDATE_FROM_OUTPUT in record.durations:
            assert record.gauges is not None
            self._num_free_blocks = record.gauges.num_free_blocks
            self.steps.append(GoldenStep(
                **self._in_flight.popleft(), finished=self._finished, num_free_blocks=self._num_free_blocks,
                end=record.start_time + sum(record.durations.values()) - self.t0))
            self._finished = {}
        self._open = False

    def close_in_flight(self) -> None:
        """The run is over: each step still in flight (scheduled after the last request's last token)
        becomes a step that finished nothing, as vLLM's recorder writes it."""
        while self._in_flight:
            step = self._in_flight.popleft()
            self.steps.append(GoldenStep(**step, finished={}, num_free_blocks=self._num_free_blocks,
                                         end=step["start"]))
