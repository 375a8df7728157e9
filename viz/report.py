"""``write_report(trace_dir, out_dir)``: every picture as PNG and SVG, and one self-contained
``report.html`` (pictures inlined as base64 PNG, a table with one row per request: its ``#`` in
arrival order, as the pictures label it, and its full id)."""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass

from viz.loader import load_trace
from viz.model import Request, Trace
from viz.plots import PICTURES

COLUMNS = ("#", "request", "prompt tokens", "output tokens", "cached tokens", "preemptions", "queue time (s)",
           "TTFT (s)", "TPOT (s)", "e2e (s)", "finish reason")


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _row(index: int, r: Request) -> list[str]:
    return [f"#{index}", r.request_id, str(r.num_prompt_tokens), str(r.num_output_tokens), str(r.cached_tokens),
            str(r.num_preemptions), _seconds(r.time_in_queue), _seconds(r.ttft), _seconds(r.tpot),
            _seconds(r.e2e), r.finish_reason or ""]


def _table(trace: Trace) -> str:
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in _row(i, r)) + "</tr>\n"
                   for i, r in enumerate(trace.requests.values()))
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}</tbody>\n</table>"


@dataclass(frozen=True, slots=True)
class Picture:
    """A picture written as ``png`` (and an SVG beside it), or the reason it could not be drawn."""

    name: str
    png: str | None
    reason: str | None = None


def write_pictures(trace: Trace, out_dir: str) -> list[Picture]:
    """Each picture as ``<name>.png`` and ``<name>.svg`` (a trace without steps has no block map)."""
    pictures = []
    for name, plot in PICTURES.items():
        try:
            figure = plot(trace)
        except ValueError as e:
            pictures.append(Picture(name, None, str(e)))
            continue
        for ext in ("svg", "png"):
            figure.savefig(os.path.join(out_dir, f"{name}.{ext}"), dpi=110)
        pictures.append(Picture(name, os.path.join(out_dir, f"{name}.png")))
    return pictures


def _section(picture: Picture) -> str:
    title = html.escape(picture.name.replace("_", " "))
    if picture.png is None:
        return f"<h2>{title}</h2>\n<p class=note>{html.escape(picture.reason or '')}</p>"
    with open(picture.png, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<h2>{title}</h2>\n<img alt="{title}" src="data:image/png;base64,{data}">'


def write_report(trace_dir: str | os.PathLike | Trace, out_dir: str | os.PathLike) -> str:
    """Write the pictures and ``report.html`` of a trace directory (or of a trace already loaded)
    into ``out_dir``; returns the page's path."""
    trace = trace_dir if isinstance(trace_dir, Trace) else load_trace(str(trace_dir))
    out_dir = str(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    sections = [_section(p) for p in write_pictures(trace, out_dir)]
    preemptions = sum(r.num_preemptions for r in trace.requests.values())
    summary = (f"{len(trace.requests)} requests, {len(trace.steps)} engine steps, {preemptions} preemptions, "
               f"{len(trace.spans)} spans from {html.escape(os.path.abspath(trace.directory))}")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>tracevllm trace report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} img {{ max-width: 100%; }} .note {{ color: #666; }}
table {{ border-collapse: collapse; }} th, td {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }}
</style></head>
<body>
<h1>tracevllm trace report</h1>
<p>{summary}</p>
{chr(10).join(sections)}
<h2>requests</h2>
{_table(trace)}
</body></html>
"""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
