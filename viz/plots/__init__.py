"""The pictures of a trace, each ``f(trace) -> matplotlib Figure`` (drawn by Agg, never shown).

The step-based ones (block map, step composition) raise ValueError for a trace without engine steps
(``--trace-level request``); the gauges then draw only the panels the requests can fill. The
workers' timeline raises it unless the model ran on several ranks (tensor or pipeline parallelism).
"""

from viz.plots.block_map import plot_kv_block_map
from viz.plots.composition import plot_step_composition
from viz.plots.gauges import plot_engine_gauges
from viz.plots.pipeline import plot_pipeline
from viz.plots.timeline import plot_request_timeline

# File stem -> picture, in the order a report shows them.
PICTURES = {
    "request_timeline": plot_request_timeline,
    "kv_block_map": plot_kv_block_map,
    "step_composition": plot_step_composition,
    "engine_gauges": plot_engine_gauges,
    "workers": plot_pipeline,
}

__all__ = ["PICTURES", "plot_engine_gauges", "plot_kv_block_map", "plot_pipeline", "plot_request_timeline",
           "plot_step_composition"]
