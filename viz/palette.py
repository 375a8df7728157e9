"""The colours that mean something, defined once for every picture of a run: the matplotlib figures
(``viz/plots/style.py``), the report's why panel (``viz/report.py``), the notebooks, and the live
page, which gets them as CSS variables and a JavaScript module (``palette_css``, ``palette_js``,
served by ``tracevllm/entrypoints/ui``). Only strings here, so the server imports it without
matplotlib. ``tests/viz/test_palette.py`` finds any of these colours written out anywhere else.

A request's state is the same colour everywhere: queued grey, prefill blue, decode green, preempted
red. The why panel's parts (``viz/explain.py``'s ``PARTS``) reuse them for a request's own work and
its preemption, and give the reasons it queued warm colours of their own.
"""

from __future__ import annotations

import json

PHASE_COLOURS = {"queued": "#c7c7c7", "prefill": "#1f77b4", "decode": "#2ca02c", "preempted": "#d62728"}
ABORT_CROSS = PHASE_COLOURS["preempted"]  # the ✕ of an aborted request: cut short, as a preempted one
WAITING = "#4d4d4d"  # the ring of a waiting request's chip, and the waiting queue's line
FREE_BLOCK = "#f2f2f2"

PART_COLOURS = {
    "frontend": "#bbbbbb",
    "queued.next_step": "#fdd0a2",
    "queued.token_budget": "#fd8d3c",
    "queued.max_num_seqs": "#8c510a",
    "queued.kv_cache": "#e6ab02",
    "queued.preemption": "#f781bf",
    "queued.in_flight": "#c51b7d",
    "queued.queued_behind": "#bf812d",
    "prefill": PHASE_COLOURS["prefill"],
    "decode": PHASE_COLOURS["decode"],
    "other_requests": "#878787",
    "preempted.waiting": PHASE_COLOURS["preempted"],
    "preempted.recompute": "#ff9896",
    "engine_loop": "#e0e0e0",
    "one_time": "#000000",
    "slower_than_usual": "#5e3c99",
}


def palette_css() -> str:
    """The palette as CSS custom properties on ``:root``: ``--prefill``, ``--waiting``, ``--part-decode``..."""
    names = {**PHASE_COLOURS, "waiting": WAITING, "free-block": FREE_BLOCK,
             **{"part-" + part.replace(".", "-"): colour for part, colour in PART_COLOURS.items()}}
    return ":root {\n" + "".join(f"  --{name}: {colour};\n" for name, colour in names.items()) + "}\n"


def palette_js() -> str:
    """The palette as a JavaScript module: ``PHASE``, ``WAITING``, ``FREE_BLOCK``, ``PART``."""
    return (f"export const PHASE = {json.dumps(PHASE_COLOURS)};\n"
            f"export const WAITING = {json.dumps(WAITING)};\n"
            f"export const FREE_BLOCK = {json.dumps(FREE_BLOCK)};\n"
            f"export const PART = {json.dumps(PART_COLOURS)};\n")
