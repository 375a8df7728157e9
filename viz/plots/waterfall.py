"""A request's span waterfall, as Jaeger's trace view draws one: a row per span of the request's
trace, parents above their children, on a time axis in ms since the request arrived, and a last row
with the engine steps that ran the request, each cut into its four stages::

    llm_request                |===========================================| 693 ms
    tokenize                   |= 1.2 ms
    scheduler.request (core)    |q|== prefill ==|========= decode ========| 690 ms   (its segments)
    prefill                      |== prefill ==| 143 ms
    decode                                      |========= decode ========| 545 ms
    detokenize                                  |=========================| 545 ms
    engine steps (core)          |1 .......... |2 ...|3 ...|4 ...| ...       (colour: the stage)

Every time, on the axis and beside the bars, is in ms. An engine step's number is written in its
bar where it does not overlap the number before it (``thin_step_labels``).

The ``scheduler.request`` row is drawn as the request's segments (queued / prefill / decode /
preempted, ``viz/segments.py``) in the timeline's colours, the ``prefill`` and ``decode`` spans in
the same colours, every other span grey; a tick marks each span event. The spans are found from the
request's ``scheduler.request``: the spans above it (``llm_request``, a server's ``POST /v1/...``)
and everything under its ``llm_request``, less another sample's spans (``request.id`` of another
request, when ``n`` > 1). Only the trace file is read: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from tracevllm.tracing.schema import STEP_STAGES, Attr, Service, SpanName
from viz.model import Request, Span, Trace
from viz.plots.style import FIGURE_WIDTH, PHASE_COLOURS, new_figure, request_labels, text_colour

STAGE_COLOURS = {SpanName.SCHEDULE: "#9467bd", SpanName.EXECUTE_MODEL: "#17becf", SpanName.SAMPLE: "#ff7f0e",
                 SpanName.UPDATE_FROM_OUTPUT: "#8c564b"}
SPAN = "0.55"  # a span that is not a phase
EVENT = "black"
ENGINE_STEPS = "engine steps"
MAX_REQUESTS = 8  # a report draws the first ones: a waterfall is for reading one request at a time
ROW_INCHES = 0.3
BAR_HEIGHT = 0.6
STEP_LABEL = "step number"  # the gid of an engine step's number, which ``thin_step_labels`` thins


@dataclass(frozen=True)
class SpanRow:
    """A row of the waterfall: a span and how deep it lies under the trace's top span."""

    span: Span
    depth: int


def _engine_core(span: Span) -> bool:
    return span.process.service == Service.ENGINE_CORE


def spans_by_trace(trace: Trace) -> dict[str, list[Span]]:
    """The trace's spans grouped by trace id (a request's trace, or an engine step's)."""
    groups: dict[str, list[Span]] = {}
    for s in trace.spans:
        groups.setdefault(s.trace_id, []).append(s)
    return groups


def request_spans(trace: Trace, request: Request, groups: dict[str, list[Span]] | None = None) -> list[SpanRow]:
    """The spans of ``request``'s trace that are about it, in tree order (a parent, then its children
    by start time); empty when the trace holds no ``scheduler.request`` for it. ``groups``:
    ``spans_by_trace(trace)``, to look up many requests."""
    spans = (groups if groups is not None else spans_by_trace(trace)).get(request.trace_id, [])
    own = next((s for s in spans if s.name == SpanName.SCHEDULER_REQUEST
                and s.attributes.get(Attr.REQUEST_ID) == request.request_id), None)
    if own is None:
        return []
    by_id = {s.span_id: s for s in spans}
    chain = [own]
    while chain[-1].parent_id in by_id:
        chain.append(by_id[chain[-1].parent_id])
    root = next((s for s in chain if s.name == SpanName.LLM_REQUEST), own)
    children: dict[str, list[Span]] = {}
    for s in spans:
        if s.parent_id is not None and s.attributes.get(Attr.REQUEST_ID, request.request_id) == request.request_id:
            children.setdefault(s.parent_id, []).append(s)
    rows = [SpanRow(s, depth) for depth, s in enumerate(reversed(chain[chain.index(root) + 1:]))]

    def descend(span: Span, depth: int) -> None:
        rows.append(SpanRow(span, depth))
        for child in sorted(children.get(span.span_id, []), key=lambda s: (s.start_ns, -s.end_ns)):
            descend(child, depth + 1)

    descend(root, len(rows))
    return rows


def step_stages(trace: Trace) -> dict[int, list[Span]]:
    """Each engine step's stage spans, by step number."""
    numbers = {s.span_id: s.attributes.get(Attr.STEP_NUMBER) for s in trace.spans if s.name == SpanName.ENGINE_STEP}
    stages: dict[int, list[Span]] = {}
    for s in trace.spans:
        if s.name in STEP_STAGES and s.parent_id in numbers:
            stages.setdefault(numbers[s.parent_id], []).append(s)
    return stages


def _duration(seconds: float) -> str:
    """In ms, the axis' unit: ``0.042 ms``, ``1.2 ms``, ``693 ms``, ``6,589 ms``."""
    ms = 1000 * seconds
    return f"{ms:.2g} ms" if ms < 10 else f"{ms:,.0f} ms"


def _duration_note(ax: Axes, start: float, stop: float, y: float, colour, axis_end: float, seconds: float) -> None:
    """The span's duration right of its bar; inside the bar's end when the bar reaches the right edge
    (left of the bar if it is also short), so that no note leaves the axes."""
    note = _duration(seconds)
    if stop < 0.75 * axis_end:
        ax.annotate(f" {note}", (stop, y), va="center", fontsize=9, color="0.25")
    elif stop - start > 0.2 * axis_end:
        ax.annotate(f"{note} ", (stop, y), ha="right", va="center", fontsize=9, color=text_colour(colour))
    else:
        ax.annotate(f"{note} ", (start, y), ha="right", va="center", fontsize=9, color="0.25")


def _label(row: SpanRow) -> str:
    return row.span.name + (" (core)" if _engine_core(row.span) else "")


def draw_request_waterfall(ax: Axes, trace: Trace, request: Request, rows: Sequence[SpanRow],
                           stages: dict[int, list[Span]]) -> set[str]:
    """Draw ``request``'s waterfall on ``ax``: ``rows`` from ``request_spans``, ``stages`` from
    ``step_stages``. Returns the kinds drawn (phases, stages, ``span``, ``event``), for a legend
    that lists only those."""
    t0 = min([request.arrival, *((s.span.start_ns - trace.t0_ns) / 1e9 for s in rows)])

    def ms(seconds: float) -> float:
        return 1000 * (seconds - t0)

    def ns(time_ns: int) -> float:
        return ms((time_ns - trace.t0_ns) / 1e9)

    drawn: set[str] = set()
    labels = []
    end = max([ms(request.finished), *(ns(r.span.end_ns) for r in rows)])
    low, high = -BAR_HEIGHT / 2, BAR_HEIGHT / 2
    for y, row in enumerate(rows):
        span = row.span
        labels.append(_label(row))
        if span.name == SpanName.SCHEDULER_REQUEST and request.segments:
            for segment in request.segments:
                ax.broken_barh([(ms(segment.start), ms(segment.end) - ms(segment.start))], (y + low, BAR_HEIGHT),
                               facecolors=PHASE_COLOURS[segment.kind])
                drawn.add(segment.kind)
            colour = PHASE_COLOURS[request.segments[-1].kind]
        else:
            kind = span.name if span.name in (SpanName.PREFILL, SpanName.DECODE) else "span"
            colour = PHASE_COLOURS.get(kind, SPAN)
            ax.broken_barh([(ns(span.start_ns), ns(span.end_ns) - ns(span.start_ns))], (y + low, BAR_HEIGHT),
                           facecolors=colour, edgecolors=colour, linewidth=0.5)  # the edge keeps a 1 µs span visible
            drawn.add(kind)
        _duration_note(ax, ns(span.start_ns), ns(span.end_ns), y, colour, end, (span.end_ns - span.start_ns) / 1e9)
        times = [ns(e.time_ns) for e in span.events]
        if times:
            ax.plot(times, [y + low] * len(times), ls="", marker="|", ms=9, mew=1.5, color=EVENT)
            drawn.add("event")
    chunks = [c for c in request.chunks if c.step in stages]
    if chunks:
        y = len(rows)
        labels.append(f"{ENGINE_STEPS} (core)")
        for chunk in chunks:
            for stage in stages[chunk.step]:
                ax.broken_barh([(ns(stage.start_ns), ns(stage.end_ns) - ns(stage.start_ns))], (y + low, BAR_HEIGHT),
                               facecolors=STAGE_COLOURS[stage.name])
                drawn.add(stage.name)
        ax.vlines([ms(c.start) for c in chunks], y + low, y + high, color="white", lw=1)  # where each step begins
        for chunk in chunks:  # all of them: thin_step_labels keeps those that do not overlap, once laid out
            ax.annotate(str(chunk.step), (ms((chunk.start + chunk.end) / 2), y), ha="center", va="center", fontsize=9,
                        gid=STEP_LABEL)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, end * 1.02 if end > 0 else 1)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8))
    ax.grid(axis="x", alpha=0.3)
    return drawn


def thin_step_labels(figure: Figure) -> None:
    """Remove the engine steps' numbers that would overlap the one before them (left to right, with a
    gap of a line's height), once the figure is laid out: a long prefill step has room for its
    number, a run of short decode steps for every few."""
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()
    for ax in figure.axes:
        right = float("-inf")
        for label in sorted((t for t in ax.texts if t.get_gid() == STEP_LABEL), key=lambda t: t.xy[0]):
            box = label.get_window_extent(renderer)
            if box.x0 < right:
                label.remove()
            else:
                right = box.x1 + box.height


def _legend_handles(drawn: set[str]) -> list:
    handles = [Patch(color=c, label=k) for k, c in PHASE_COLOURS.items() if k in drawn]
    if "span" in drawn:
        handles.append(Patch(color=SPAN, label="other span"))
    if "event" in drawn:
        handles.append(Line2D([], [], ls="", marker="|", ms=9, mew=1.5, color=EVENT, label="span event"))
    handles += [Patch(color=c, label=f"stage: {k}") for k, c in STAGE_COLOURS.items() if k in drawn]
    return handles


def _title(request: Request, label: str) -> str:
    """``Request #i``, its id where short enough (a server's are 40 characters: the report's table
    has them), its output tokens and steps."""
    name = f'Request {label} (id "{request.request_id}")' if len(request.request_id) <= 16 else f"Request {label}"
    steps = f", {len(request.chunks)} engine steps (numbered)" if request.chunks else ""
    return f"{name}: {request.num_output_tokens} output tokens{steps}"


def plot_request_waterfall(trace: Trace, request_id: str) -> Figure:
    """One request's waterfall (a notebook's picture)."""
    if request_id not in trace.requests:
        raise ValueError(f"no request {request_id!r} in {trace.directory}: its requests are {list(trace.requests)[:5]}")
    request = trace.requests[request_id]
    rows = request_spans(trace, request)
    figure = new_figure(FIGURE_WIDTH, 1.8 + ROW_INCHES * (len(rows) + 1))
    ax = figure.add_subplot()
    drawn = draw_request_waterfall(ax, trace, request, rows, step_stages(trace))
    ax.set_xlabel("ms since the request arrived")
    ax.set_title(_title(request, request_labels(trace.requests)[request_id]), fontsize=10, loc="left")
    figure.legend(handles=_legend_handles(drawn), loc="outside lower center", ncol=3, frameon=False, fontsize=9)
    thin_step_labels(figure)
    return figure


def plot_request_waterfalls(trace: Trace, max_requests: int = MAX_REQUESTS) -> Figure:
    """A panel per request, the first ``max_requests`` in arrival order that have spans (the title
    says when some are left out), each on its own time axis. ValueError when no request has spans."""
    groups = spans_by_trace(trace)
    requests: list[tuple[Request, list[SpanRow]]] = []
    for request in trace.requests.values():
        if len(requests) < max_requests and (rows := request_spans(trace, request, groups)):
            requests.append((request, rows))
    if not requests:
        raise ValueError(f"{trace.directory}: no scheduler.request span: the trace holds no request's spans")
    labels = request_labels(trace.requests)
    stages = step_stages(trace)
    heights = [len(rows) + bool(stages) + 1.6 for _, rows in requests]
    figure = new_figure(FIGURE_WIDTH, 1.2 + ROW_INCHES * sum(heights))
    axes = figure.subplots(len(requests), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    drawn: set[str] = set()
    for ax, (request, rows) in zip(axes, requests):
        drawn |= draw_request_waterfall(ax, trace, request, rows, stages)
        ax.set_title(_title(request, labels[request.request_id]), fontsize=10, loc="left")
    axes[-1].set_xlabel("ms since the request arrived (each panel on its own axis)")
    shown = (f"the first {len(requests)} of {len(trace.requests)} requests" if len(requests) < len(trace.requests)
             else f"{len(requests)} request{'s' if len(requests) > 1 else ''}")
    figure.suptitle(f"Span waterfalls: {shown}, in arrival order")
    figure.legend(handles=_legend_handles(drawn), loc="outside lower center", ncol=3, frameon=False, fontsize=9)
    thin_step_labels(figure)
    return figure
