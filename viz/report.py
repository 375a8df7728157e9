"""``write_report(trace_dir, out_dir)``: every picture as PNG and SVG, and one self-contained
``report.html``: each picture (inlined as base64 PNG) with a one-line caption on how to read it, and
a "why" panel (each request's e2e charged to its causes, ``viz/explain.py``), and a table with one
row per request (its ``#`` in arrival order, as the pictures label it, its full id and its latencies).

A section has something to show or is not there: a picture that needs what the run did not have
(``OPTIONAL``: the workers of a one-process run) is left out without a word; one that needs what
the trace did not record (engine steps, at ``--trace-level request``) is named in one note at the top.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass

from viz.explain import PARTS, describe, explain
from viz.trace_loader import load_trace
from viz.model import Request, Trace
from viz.palette import PART_COLOURS
from viz.plots import CAPTIONS, OPTIONAL, PICTURES
from viz.plots.style import request_labels
from viz.plots.waterfall import MAX_REQUESTS

COLUMNS = ("#", "request", "prompt tokens", "output tokens", "cached tokens", "preemptions", "queue time (s)",
           "TTFT (s)", "TPOT (s)", "e2e (s)", "finish reason")


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _row(index: int, r: Request) -> list[str]:
    return [f"#{index}", r.request_id, str(r.num_prompt_tokens), str(r.num_output_tokens), str(r.cached_tokens),
            str(r.num_preemptions), _seconds(r.time_in_queue), _seconds(r.ttft), _seconds(r.tpot),
            _seconds(r.e2e), r.finish_reason or ""]


def _table(trace: Trace) -> str:
    if not trace.requests:
        return ""
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in _row(i, r)) + "</tr>\n"
                   for i, r in enumerate(trace.requests.values()))
    return f"<h2>requests</h2>\n<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}</tbody>\n</table>"


MAX_WHY_REQUESTS = 40


def _why(trace: Trace) -> str:
    """The "why" panel: a key of the parts drawn (``viz/palette.py``'s colours), each request's e2e as a
    bar of its parts (the slowest first), and the explanation in words under it."""
    if not trace.has_steps:
        return ""
    explanations = explain(trace)
    if not explanations:
        return ""
    longest = explanations[0].e2e_s or 1.0
    labels = request_labels(trace.requests)
    shown = {part for x in explanations[:MAX_WHY_REQUESTS] for part in x.parts}
    legend = "".join(f'<li><span class=key style="background:{PART_COLOURS[p]}"></span>{html.escape(p)}</li>'
                     for p in PARTS if p in shown)
    rows = []
    for x in explanations[:MAX_WHY_REQUESTS]:
        segments = "".join(
            f'<span style="width:{100 * seconds / longest:.3f}%;background:{PART_COLOURS[part]}" '
            f'title="{html.escape(part)}: {seconds:.4f} s"></span>'
            for part, seconds in ((p, x.parts[p]) for p in PARTS if p in x.parts))
        request_id = html.escape(x.request_id)
        rows.append(f'<details><summary><span class=label title="{request_id}">{labels[x.request_id]} '
                    f'<code>{request_id}</code></span><span class=e2e>{x.e2e_s:.3f} s</span>'
                    f'<span class=bar>{segments}</span></summary><pre>{html.escape(describe(x))}</pre></details>')
    more = (f"<p class=note>The {MAX_WHY_REQUESTS} slowest of {len(explanations)} requests; "
            "<code>tracevllm traces explain DIR</code> explains them all.</p>"
            if len(explanations) > MAX_WHY_REQUESTS else "")
    return (f"<h2>why</h2>\n<p>Every second of each request's end-to-end latency, charged to a cause "
            f"(<code>tracevllm traces explain</code>); open a request for the explanation in words.</p>\n"
            f"<ul class=legend>{legend}</ul>\n" + "\n".join(rows) + more)


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


def _title(name: str) -> str:
    return html.escape(name.replace("_", " "))


def _caption(name: str, trace: Trace) -> str:
    caption = CAPTIONS[name]
    if name == "request_waterfall" and len(trace.requests) > MAX_REQUESTS:
        caption += (f" Only the first {MAX_REQUESTS} of the {len(trace.requests)} requests are drawn: "
                    "viz.plots.plot_request_waterfall(trace, request_id) draws any other.")
    return caption


def _section(picture: Picture, trace: Trace) -> str:
    with open(picture.png, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return (f'<h2>{_title(picture.name)}</h2>\n<figure><img alt="{_title(picture.name)}" '
            f'src="data:image/png;base64,{data}">\n'
            f"<figcaption>{html.escape(_caption(picture.name, trace))}</figcaption></figure>")


def _not_drawn(pictures: list[Picture]) -> str:
    """One note for the pictures the trace cannot fill, grouped by reason."""
    reasons: dict[str, list[str]] = {}
    for p in pictures:
        if p.png is None and p.name not in OPTIONAL:
            reasons.setdefault(p.reason or "", []).append(_title(p.name))
    return "".join(f"<p class=note>Not drawn: {', '.join(names)}: {html.escape(reason)}</p>\n"
                   for reason, names in reasons.items())


def write_report(trace_dir: str | os.PathLike | Trace, out_dir: str | os.PathLike) -> str:
    """Write the pictures and ``report.html`` of a trace directory (or of a trace already loaded)
    into ``out_dir``; returns the page's path."""
    trace = trace_dir if isinstance(trace_dir, Trace) else load_trace(str(trace_dir))
    out_dir = str(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    pictures = write_pictures(trace, out_dir)
    sections = [_section(p, trace) for p in pictures if p.png is not None]
    preemptions = sum(r.num_preemptions for r in trace.requests.values())
    counts = ", ".join(f"{n} {noun}{'s' if n != 1 else ''}" for n, noun in (
        (len(trace.requests), "request"), (len(trace.steps), "engine step"), (preemptions, "preemption"),
        (len(trace.spans), "span")))
    summary = f"{counts} from {html.escape(os.path.abspath(trace.directory))}"
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>tracevllm trace report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} img {{ max-width: 100%; }} .note {{ color: #666; }}
figure {{ margin: 0 0 2em 0; }} figcaption {{ color: #444; max-width: 60em; margin-top: 0.3em; }}
table {{ border-collapse: collapse; }} th, td {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }}
summary {{ display: flex; align-items: center; gap: 0.6em; max-width: 60em; cursor: pointer; }}
summary::before {{ content: "▸"; }} details[open] summary::before {{ content: "▾"; }}
.bar {{ display: flex; flex: 1; height: 0.9em; }} .bar span {{ height: 100%; }}
.e2e {{ width: 5em; text-align: right; }}
.legend {{ list-style: none; padding: 0; max-width: 60em; display: grid; gap: 0.2em 1em;
          grid-template-columns: repeat(auto-fill, minmax(13em, 1fr)); }} .legend li {{ white-space: nowrap; }}
.key {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.4em; vertical-align: middle; }}
details pre {{ margin: 0.3em 0 0.8em 1.5em; white-space: pre-wrap; }}
.label {{ width: 12em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }}
</style></head>
<body>
<h1>tracevllm trace report</h1>
<p>{summary}</p>
{_not_drawn(pictures)}{chr(10).join(sections)}
{_why(trace)}
{_table(trace)}
</body></html>
"""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
