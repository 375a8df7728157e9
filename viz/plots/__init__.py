"""The pictures of a trace, each ``f(trace) -> matplotlib Figure`` (drawn by Agg, never shown), and
the one-line caption that says how to read each.

The step-based ones (block map, step composition) raise ValueError for a trace without engine steps
(``--trace-level request``); the gauges then draw only the panels the requests can fill. The
workers' timeline raises it unless the model ran on several ranks (tensor or pipeline parallelism):
``OPTIONAL`` pictures, which a report leaves out without a word when the run has nothing for them.
"""

from viz.plots.block_map import plot_kv_block_map
from viz.plots.composition import plot_step_composition
from viz.plots.gauges import plot_engine_gauges
from viz.plots.pipeline import plot_pipeline
from viz.plots.timeline import plot_request_timeline
from viz.plots.waterfall import plot_request_waterfall, plot_request_waterfalls

# File stem -> picture, in the order a report shows them.
PICTURES = {
    "request_timeline": plot_request_timeline,
    "request_waterfall": plot_request_waterfalls,
    "kv_block_map": plot_kv_block_map,
    "step_composition": plot_step_composition,
    "engine_gauges": plot_engine_gauges,
    "workers": plot_pipeline,
}
OPTIONAL = frozenset({"workers"})

CAPTIONS = {
    "request_timeline": "Each row is a request, in arrival order (#i; the full ids are in the table below); colour "
                        "is what it was doing: grey queued, blue prefill, green decode, red preempted (waiting to run "
                        "again); the thin line before a bar is its way from arrival to the engine core's queue, ◆ "
                        "the first token, ✕ an abort; time runs left to right.",
    "request_waterfall": "Each panel is one request, each row one span of its trace (“core”: written by the engine "
                         "core), a parent above its children, its duration at its end; colour: blue prefill, green "
                         "decode, red preempted, light grey queued, dark grey any other span; the last row is the "
                         "engine steps that ran the request, numbered, coloured by stage; a tick is a span event; "
                         "time runs left to right, in ms since the request arrived.",
    "kv_block_map": "Each row is a physical KV block (those ever used), each column an engine step; colour is the "
                    "request holding the block after the step (#i, as in the key), pale grey free; hatched: shared "
                    "through the prefix cache; ×: a new owner, the old KV thrown away; ▼: a step that preempted; "
                    "steps run left to right.",
    "step_composition": "Each bar is an engine step's scheduled tokens, blue prefill under green decode, against the "
                        "token budget (purple); the black line is the batch size (right axis); ▼: a step that "
                        "preempted; steps run left to right.",
    "engine_gauges": "Each panel is one gauge of the engine over the run (KV cache usage, the running and waiting "
                     "queues, the prefix-cache hit rate so far, output tokens per second); time runs left to right, "
                     "in seconds since the first span.",
    "workers": "Each row is a rank, grouped by pipeline stage; each bar a batch it ran, coloured and numbered by "
               "the engine step that scheduled it; the hatched start is the wait for the previous stage's tensors; "
               "time runs left to right.",
}

__all__ = ["CAPTIONS", "OPTIONAL", "PICTURES", "plot_engine_gauges", "plot_kv_block_map", "plot_pipeline",
           "plot_request_timeline", "plot_request_waterfall", "plot_request_waterfalls", "plot_step_composition"]
