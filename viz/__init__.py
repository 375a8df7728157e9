"""Replaying ``--trace-out`` directories: load them as typed objects, draw them, export them.

    trace = viz.load_trace("traces/")          # requests, engine steps, spans (viz/model.py)
    viz.plot_kv_block_map(trace)               # a matplotlib Figure
    viz.write_report("traces/", "report/")     # PNG + SVG + report.html
    viz.write_perfetto(trace, "trace.json")    # for ui.perfetto.dev

Depends on matplotlib, numpy and the trace files only, never on torch or tracevllm.
"""

from viz.loader import load_trace
from viz.model import Admission, Chunk, PrefixHit, Process, Request, Segment, Span, SpanEvent, Step, Trace
from viz.perfetto import write_perfetto
from viz.plots import plot_engine_gauges, plot_kv_block_map, plot_request_timeline, plot_step_composition
from viz.replay import render_step, write_animation
from viz.report import write_report

__all__ = [
    "Admission", "Chunk", "PrefixHit", "Process", "Request", "Segment", "Span", "SpanEvent", "Step", "Trace",
    "load_trace", "plot_engine_gauges", "plot_kv_block_map", "plot_request_timeline", "plot_step_composition",
    "render_step", "write_animation", "write_perfetto", "write_report",
]
