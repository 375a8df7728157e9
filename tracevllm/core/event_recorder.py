"""The engine core's one channel for events: the ``EventRecorder``, and the observers it tells.

Everything in ``core/events.py`` is recorded here, and each observer (the OpenTelemetry tracer in
``tracevllm/tracing/``, the server's live stream in ``engine/event_publisher.py``, a test, a notebook)
hears every event in order, from the moment it is added until it is removed::

    Scheduler, KVCacheManager, BlockPool, EngineCore, Worker
                                   │
                       EventRecorder.record(event) ──▶ observer.on_event(event)

With no observer, ``recorder.enabled`` is False and every recording site is
``if self.recorder.enabled: self.recorder.record(...)``: one flag check, nothing built.

A step's ``StepRecord`` is assembled here: the scheduler hands its ``BatchScheduled`` and
``StepGauges`` to ``hold_for_step()``, which keeps them in the open step; ``step()`` times the stages
(and keeps the model runner's laps of its host path, ``LapTimer``) and records one ``StepRecord``
with all of it when the step closes.

Times come from the recorder's clock: the wall clock (``time.time``, the stages lapped on
``time.perf_counter``), or a replay's simulated clock (``tracevllm/whatif/``), which then stamps the
events and times the stages alike: the scheduler asks the recorder what time it is (``now()``).

Observers only listen, with one exception, explicit: an observer that is a ``StepContextProvider``
(the tracer) is asked, as each step starts, for what the step should carry to the workers (its trace
context). The engine core passes that on in ``SchedulerOutput.step_context`` without reading it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from tracevllm.core.events import BatchScheduled, EngineEvent, StartupPhase, StepGauges, StepRecord, StepStarted
from tracevllm.core.stages import STEP_STAGES


class EngineObserver(Protocol):
    """Hears every event the recorder records, in order."""

    def on_event(self, event: EngineEvent) -> None: ...


@runtime_checkable
class StepContextProvider(Protocol):
    """An observer with a counterpart in the workers. Once a step's ``StepStarted`` is recorded, the
    recorder asks it for ``step_context()``; the engine core sends the answer with the step's batch
    (``SchedulerOutput.step_context``) and each worker's ``WorkerStepRecord`` carries it to the
    worker's observers. The tracer's is the step's W3C trace context, so that the workers' spans join
    the step's trace; the core only carries it, as it carries a request's ``trace_headers``."""

    def step_context(self) -> dict[str, str]: ...


# ---- the recorder -----------------------------------------------------------------------------

class LapTimer:
    """Times consecutive stretches: ``lap(name)`` ends the one that ran since the last lap (or since
    the timer was made), and keeps its seconds in ``durations``."""

    timing = True

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._last = clock()
        self.durations: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = self.clock()
        self.durations[name] = now - self._last
        self._last = now


class _NoLaps(LapTimer):
    """What is timed when nobody observes: a lap costs a method call, nothing is kept."""

    timing = False

    def __init__(self) -> None:
        self.durations = {}

    def lap(self, name: str) -> None:
        pass


NO_LAPS = _NoLaps()


class StepTimer(LapTimer):
    """Times the stages of one step: ``lap(stage, parts)`` ends the stage that ran since the last
    lap; ``parts`` are the model runner's laps inside it (``core/stages.py``'s ``StepPart``), as
    they came back from the executor."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        """``clock``: a simulated one times the stages and the start alike; None: the wall clock."""
        super().__init__(clock or time.perf_counter)
        self.start_time = time.time() if clock is None else clock()
        self.parts: dict[str, float] = {}
        self.forward_device_s: float | None = None
        self.batch: BatchScheduled | None = None
        self.gauges: StepGauges | None = None
        self.context: dict[str, str] | None = None  # for the step's workers (StepContextProvider)

    def lap(self, stage: str, parts: dict[str, float] | None = None) -> None:
        super().lap(stage)
        if parts:
            self.parts.update(parts)

    def device_time(self, forward_device_s: float | None) -> None:
        """The device time of the forward and the logits (CUDA only; None elsewhere)."""
        self.forward_device_s = forward_device_s


class _NoTimer(StepTimer):
    """What ``step()`` yields when nobody observes: laps cost a method call, nothing is kept."""

    timing = False
    context = None

    def __init__(self) -> None:
        pass

    def lap(self, stage: str, parts: dict[str, float] | None = None) -> None:
        pass

    def device_time(self, forward_device_s: float | None) -> None:
        pass


_NO_TIMER = _NoTimer()


class EventRecorder:
    """The engine core's one channel for events: hands each to every observer, in order."""

    def __init__(self, observers: Sequence[EngineObserver] = (), clock: Callable[[], float] | None = None) -> None:
        self.observers: list[EngineObserver] = []
        self.clock = clock  # None: the wall clock; a replay's simulated clock otherwise
        self.context_providers: list[StepContextProvider] = []
        self.enabled = False
        self.num_steps = 0
        self._open_step: StepTimer | None = None
        for observer in observers:
            self.add_observer(observer)

    def now(self) -> float:
        """What time it is for what is recorded: the wall clock, or a replay's simulated clock."""
        return time.time() if self.clock is None else self.clock()

    def add_observer(self, observer: EngineObserver) -> None:
        """Start telling ``observer`` (the tracer, a test, a notebook) everything from now on."""
        self.observers.append(observer)
        if isinstance(observer, StepContextProvider):
            self.context_providers.append(observer)
        self.enabled = True

    def remove_observer(self, observer: EngineObserver) -> None:
        """Stop telling ``observer``; with no observer left, recording is off again (one flag check)."""
        self.observers = [o for o in self.observers if o is not observer]  # by identity: a test's may be a list
        self.context_providers = [p for p in self.context_providers if p is not observer]
        self.enabled = bool(self.observers)

    def record(self, event: EngineEvent) -> None:
        """Hand ``event`` to every observer, in order."""
        for observer in self.observers:
            observer.on_event(event)

    def hold_for_step(self, part: BatchScheduled | StepGauges) -> None:
        """Keep ``part`` for the open step's ``StepRecord``: observers hear it there, with the step's
        clock, not alone. Outside a step (a test driving the scheduler alone) there is no record to
        keep it for, and it is dropped."""
        step = self._open_step
        if step is None:
            return
        if isinstance(part, BatchScheduled):
            step.batch = part
        else:
            step.gauges = part

    @contextmanager
    def step(self) -> Iterator[StepTimer]:
        """Around one ``EngineCore.step()``: yields the step's timer and, when the step ends (even
        by an exception), records its ``StepRecord``. Steps are numbered from 1."""
        self.num_steps += 1
        if not self.enabled:
            yield _NO_TIMER
            return
        timer = self._open_step = StepTimer(self.clock)
        self.record(StepStarted(self.num_steps, timer.start_time))
        timer.context = self._step_context()
        error = None
        try:
            yield timer
        except BaseException as e:
            error = repr(e)
            raise
        finally:
            self._open_step = None
            durations = {stage: timer.durations[stage] for stage in STEP_STAGES if stage in timer.durations}
            self.record(StepRecord(self.num_steps, timer.start_time, durations, timer.batch, timer.gauges, error,
                                   timer.parts, timer.forward_device_s))

    def _step_context(self) -> dict[str, str] | None:
        """What the providers give the step that just started to carry to its workers (None: nothing)."""
        context: dict[str, str] = {}
        for provider in self.context_providers:
            context.update(provider.step_context())
        return context or None

    @contextmanager
    def phase(self, name: str, attributes: dict[str, str | int | float] | None = None) -> Iterator[dict]:
        """Around one start-up phase: records a ``StartupPhase`` when it ends. The yielded dict
        takes attributes learned during the phase (e.g. the number of KV blocks)."""
        attributes = dict(attributes or {})
        start = self.now()
        yield attributes
        if self.enabled:
            self.record(StartupPhase(name, start, self.now(), attributes))
