"""Tracing: observers that turn what the engine records into OpenTelemetry spans.

The engine never builds a span. It records typed events (``tracevllm/core/events.py``) and keeps a
stats record per request (``tracevllm/metrics/stats.py``); the observers here listen::

    engine core ── events ──▶ EngineCoreTracer (engine_tracer.py) ─▶ scheduler.request, engine_step,
                                                                      start-up spans (tracevllm.engine_core)
    each worker ── events ──▶ WorkerTracer (worker_tracer.py) ─────▶ worker.execute_model per rank
                                                                      (tracevllm.worker)
    front end ─ stats, outputs ─▶ RequestTracer (request_tracer.py) ─▶ llm_request, tokenize, prefill,
                                                                      decode, detokenize (tracevllm)
    server ── each API call ──▶ http.py ─▶ POST /v1/... (tracevllm)

``otel.py`` sets up providers and exporters, ``schema.py`` names every span and attribute,
``file_exporter.py`` writes ``--trace-out`` files. This package records only: what reads the files
back (the pictures, ``traces explain``, the Jaeger and OTLP exports) is ``viz/``, which imports
nothing of tracevllm's but ``schema.py`` and the step-cost model (``tracevllm/step_cost.py``).

Importing this package loads nothing heavy: the factories below import OpenTelemetry only when
tracing is on, so the engine can call them, and ``viz`` import ``schema``, freely. Nothing under
``core/`` imports tracing; the tracers import the core's events and names
(``core/events.py``, ``core/stages.py``). The tracers complete their trace files when their side
goes idle: the engine core's and the workers' on ``EngineIdle``, the front end's when its start-up
trace ends and when its last open request closes. ``flush_traces`` below is for the rest (a process
that exits, a notebook).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracevllm.config import ObservabilityConfig
    from tracevllm.core.event_recorder import EngineObserver
    from tracevllm.tracing.request_tracer import RequestTracer


def make_engine_observers(config: "ObservabilityConfig", startup_trace_headers: dict[str, str] | None = None,
                          ) -> list["EngineObserver"]:
    """The engine core's observers: its tracer when tracing is on, else none (events cost nothing)."""
    if not config.tracing_enabled:
        return []
    from tracevllm.tracing.engine_tracer import EngineCoreTracer

    return [EngineCoreTracer(config, startup_trace_headers)]


def make_worker_observers(config: "ObservabilityConfig") -> list["EngineObserver"]:
    """A worker's observers: its tracer when engine steps are traced (``--trace-level step``)."""
    if not config.tracing_enabled or config.trace_level != "step":
        return []
    from tracevllm.tracing.worker_tracer import WorkerTracer

    return [WorkerTracer(config)]


def make_request_tracer(config: "ObservabilityConfig", model_name: str, tokenizer) -> "RequestTracer | None":
    """The front end's tracer when tracing is on, else None."""
    if not config.tracing_enabled:
        return None
    from tracevllm.tracing.request_tracer import RequestTracer

    return RequestTracer(config, model_name, tokenizer)


class _NoStartup:
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield None


@contextmanager
def trace_startup(tracer: "RequestTracer | None", done: list[tuple[str, float, float]]) -> Iterator[Any]:
    """The front end's start-up trace (``RequestTracer.startup``), or, when tracing is off, a
    recorder whose ``phase(name)`` records nothing and yields no trace headers."""
    if tracer is None:
        yield _NoStartup()
    else:
        with tracer.startup(done) as startup:
            yield startup


def flush_traces() -> None:
    """Complete the trace files with every span ended so far (nothing to do when tracing never started)."""
    import sys

    otel = sys.modules.get("tracevllm.tracing.otel")
    if otel is not None:
        otel.flush_traces()
