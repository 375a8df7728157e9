"""``write_report``, ``write_perfetto`` and ``python -m viz`` on a real trace."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import viz
from tests.trace_utils import load_spans
from viz.report_cli import main
from viz.explain import describe, explain
from viz.palette import PHASE_COLOURS
from viz.plots import CAPTIONS


class _Page(HTMLParser):
    """The rows of the page's table body, its inlined images, its section titles and its captions."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.images: list[str] = []
        self.titles: list[str] = []
        self.captions: list[str] = []
        self._in_body = self._in_cell = False
        self._text: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td":
            self._in_cell = True
            self.rows[-1].append("")
        elif tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag in ("h2", "figcaption"):
            self._text = (self.titles if tag == "h2" else self.captions)
            self._text.append("")

    def handle_endtag(self, tag):
        self._in_body = self._in_body and tag != "tbody"
        self._in_cell = self._in_cell and tag != "td"
        if tag in ("h2", "figcaption"):
            self._text = None

    def handle_data(self, data):
        if self._in_cell:
            self.rows[-1][-1] += data
        if self._text is not None:
            self._text[-1] += data


@pytest.fixture(scope="module")
def trace(recording):
    return viz.load_trace(recording.trace_dir)


DRAWN = ["request_timeline", "request_waterfall", "kv_block_map", "step_composition", "engine_gauges"]


def test_report_has_every_picture_and_a_row_per_request(recording, trace, tmp_path):
    path = viz.write_report(recording.trace_dir, tmp_path / "report")
    page = _Page()
    page.feed(Path(path).read_text())
    assert len(page.images) == 5 and all(src.startswith("data:image/png;base64,") for src in page.images)
    # A section per picture drawn, each with its caption; the one-process run has no workers section.
    assert page.titles == [name.replace("_", " ") for name in DRAWN] + ["why", "requests"]
    assert page.captions == [CAPTIONS[name] for name in DRAWN]
    assert all("left to right" in caption for caption in page.captions)
    assert "worker" not in Path(path).read_text().lower()
    # Each row pairs the picture's label (the index in arrival order) with the full id.
    assert [row[:2] for row in page.rows] == [[f"#{i}", r] for i, r in enumerate(trace.requests)]
    by_id = {row[1]: row for row in page.rows}
    for out in recording.outputs:
        row = by_id[out.request_id]
        assert row[3] == str(len(out.outputs[0].token_ids)) and row[4] == str(out.num_cached_tokens)
        assert row[5] == str(recording.preemptions[out.request_id]) and row[-1] == "length"
    for name in DRAWN:
        assert (tmp_path / "report" / f"{name}.png").is_file() and (tmp_path / "report" / f"{name}.svg").is_file()


def test_report_explains_every_request(recording, trace, tmp_path):
    """The "why" panel: one entry per request, the slowest first, each a bar of its parts and the
    explanation in words (``viz/explain.py``)."""
    text = Path(viz.write_report(recording.trace_dir, tmp_path)).read_text()
    why = text[text.index("<h2>why</h2>"):text.index("<h2>requests</h2>")]
    explanations = explain(trace)
    assert why.count("<details>") == len(explanations) == len(trace.requests)
    positions = [why.index(f"<code>{x.request_id}</code>") for x in explanations]
    assert positions == sorted(positions)
    assert all(html.escape(describe(x)) in why for x in explanations)
    # The key: one item per part drawn, in the palette's colours (prefill blue, as in every picture).
    item = r'<li><span class=key style="background:(#\w+)"></span>([\w.]+)</li>'
    key = {part: colour for colour, part in re.findall(item, why)}
    assert set(key) == {part for x in explanations for part in x.parts}
    assert key["prefill"] == PHASE_COLOURS["prefill"] and key["decode"] == PHASE_COLOURS["decode"]


def test_report_of_a_request_level_trace_says_once_what_is_missing(request_level_dir, tmp_path):
    page = _Page()
    text = Path(viz.write_report(request_level_dir, tmp_path)).read_text()
    page.feed(text)
    assert len(page.images) == 3 and len(page.rows) == 2
    # No empty section: the pictures that need engine steps are named in one note at the top.
    assert page.titles == ["request timeline", "request waterfall", "engine gauges", "requests"]
    (note,) = [line for line in text.splitlines() if line.startswith("<p class=note>Not drawn:")]
    assert "kv block map, step composition" in note and "--trace-level request" in note
    assert "worker" not in text.lower()


def test_report_has_a_waterfall_of_the_first_requests_at_scale(tmp_path):
    """100 requests: the waterfall draws the first ``MAX_REQUESTS``, and its caption and title say so."""
    from tests.viz.synthetic import synthetic_trace
    from viz.plots.waterfall import MAX_REQUESTS

    trace = synthetic_trace(num_requests=20, num_blocks=400, num_steps=100)
    page = _Page()
    page.feed(Path(viz.write_report(trace, tmp_path)).read_text())
    assert "request waterfall" in page.titles
    caption = page.captions[page.titles.index("request waterfall")]
    assert f"Only the first {MAX_REQUESTS} of the 20 requests are drawn" in caption
    assert (tmp_path / "request_waterfall.png").is_file()
    # The workers picture is there when several ranks ran the model (the synthetic trace has four).
    assert "workers" in page.titles


def test_perfetto_has_one_complete_event_per_span_nested_on_each_track(recording, trace, tmp_path):
    events = json.loads(Path(viz.write_perfetto(trace, str(tmp_path / "t.json"))).read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert sorted((e["args"]["span_id"], e["name"]) for e in complete) == sorted(
        (s["spanId"], s["name"]) for s in load_spans(recording.trace_dir))
    names = {(e["pid"], e.get("tid")): e["args"]["name"]
             for e in events if e["name"] in ("process_name", "thread_name")}
    assert {names[e["pid"], None] for e in complete} == {f"MainProcess (pid {e['pid']})" for e in complete}
    tracks = {names[e["pid"], e["tid"]] for e in complete}
    assert "engine steps" in tracks and {f"request {r}" for r in trace.requests} <= tracks
    # On each track, a slice either ends before the next one starts or contains it (in whole
    # nanoseconds, as Perfetto reads the microseconds: a float sum ts + dur may be off by 1e-11).
    by_track: dict = {}
    for e in complete:
        start = round(e["ts"] * 1000)
        by_track.setdefault((e["pid"], e["tid"]), []).append((start, start + round(e["dur"] * 1000)))
    for slices in by_track.values():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[int] = []
        for start, end in slices:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1]
            open_ends.append(end)


def test_perfetto_names_each_process(multiprocess_dir, tmp_path):
    trace = viz.load_trace(multiprocess_dir)
    events = json.loads(Path(viz.write_perfetto(trace, str(tmp_path / "t.json"))).read_text())["traceEvents"]
    processes = {e["args"]["name"].split(" (pid")[0] for e in events if e["name"] == "process_name"}
    assert processes == {"MainProcess", "EngineCore"}
    assert sum(e["ph"] == "X" for e in events) == len(trace.spans)


def test_cli_writes_report_and_perfetto(recording, tmp_path, capsys):
    out, perfetto = tmp_path / "out", tmp_path / "trace.json"
    assert main([recording.trace_dir, "-o", str(out), "--perfetto", str(perfetto)]) == 0
    assert (out / "report.html").is_file() and json.loads(perfetto.read_text())["traceEvents"]
    assert capsys.readouterr().out.splitlines()[0] == f"wrote {out / 'report.html'}"
    assert main([str(tmp_path / "empty"), "-o", str(out)]) == 1
    assert "no such trace directory" in capsys.readouterr().err
    assert main([recording.trace_dir]) == 2


def test_python_dash_m_viz(tmp_path):
    result = subprocess.run([sys.executable, "-m", "viz", str(tmp_path)], capture_output=True, text=True,
                            cwd=Path(__file__).parents[2])
    assert result.returncode == 2 and "nothing to write" in result.stderr
