"""Replaying ``--trace-out`` directories: load them as typed objects, draw them, export them.

    trace = viz.load_trace("traces/")          # requests, engine steps, spans (viz/model.py)
    viz.plot_kv_block_map(trace)               # a matplotlib Figure
    viz.plot_request_waterfall(trace, "0")     # one request's spans on a time axis, as Jaeger shows them
    viz.write_report("traces/", "report/")     # PNG + SVG + report.html
    viz.write_perfetto(trace, "trace.json")    # for ui.perfetto.dev
    viz.load_workload(trace)                   # each request as submitted, and what it produced
    viz.fit_trace(trace)                       # what a step costs, from its batch (tracevllm/step_cost.py)
    viz.compare_runs(trace, other)             # two runs of one workload: where they part, and why

Depends on matplotlib, numpy, msgspec and the trace files (the Jaeger and OTLP exports, ``jaeger.py``
and ``export.py``, on OpenTelemetry's protobuf messages too), never on torch. Of tracevllm it imports
two low modules that import nothing of the engine: the trace schema (``tracevllm/tracing/schema.py``:
the names of the spans, events and attributes) and the step-cost model (``tracevllm/step_cost.py``,
numpy only), which the engine's start-up sizes its token budget with; the engine below and ``tracing/`` import nothing of viz's, and the commands that run the
engine on a trace (``tracevllm/entrypoints/``, ``whatif/``, ``parity/``) import viz
(``tests/test_package_structure.py`` holds both directions). The names load on first use, so that
``import viz`` (and ``tracevllm --help``, which lists viz's command) does not wait for matplotlib.
"""

import importlib

_EXPORTS = {
    **{name: "viz.model" for name in (
        "Admission", "Chunk", "Preemption", "PrefixHit", "Process", "Request", "Segment", "Span", "SpanEvent", "Step",
        "Trace", "Wait")},
    "load_trace": "viz.trace_loader",
    "load_workload": "viz.workload",
    "RecordedRequest": "viz.workload",
    "fit_trace": "viz.fit",
    "compare_runs": "viz.diff",
    "plot_aligned_timelines": "viz.plots.aligned_timelines",
    "write_perfetto": "viz.perfetto",
    **{name: "viz.plots" for name in (
        "plot_engine_gauges", "plot_kv_block_map", "plot_request_timeline", "plot_request_waterfall",
        "plot_step_composition")},
    "render_step": "viz.animation",
    "write_animation": "viz.animation",
    "write_report": "viz.report",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    try:  # a submodule, as in viz.animation.render_step(...)
        return importlib.import_module(f"viz.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"viz.{name}":
            raise
        raise AttributeError(f"module 'viz' has no attribute {name!r}") from None
