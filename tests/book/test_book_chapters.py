"""The chapters cannot rot: what they link, name and show must exist.

The conventions checked (chapters/ follows them):
- ``chapters/NN-slug.md`` and ``notebooks/NN-slug.ipynb`` come in pairs; the chapter's title is
  ``# N. ...`` and it links its own notebook exactly once.
- Every local link resolves. A link to a source file, ``[...](../tracevllm/x/y.py)``, names an
  existing file, and when its text is a backticked dotted name (``[`Scheduler.schedule`](...)``)
  that name is defined in that file.
- The section ``## What the trace shows`` starts with a table whose first column holds span and span
  event names, each of them in ``tracevllm/tracing/schema.py``.
- Every picture exists, each chapter shows at least one of its own (``images/NN-*.png``), and each of
  those is written by the chapter's notebook (the pictures are drawn from a real trace, by code).
- The chapter ends with 2-4 exercises, each with a collapsed answer; notebooks are committed
  without outputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tracevllm.tracing.schema import EventName, SpanName
from chapters.book import REPO, chapter_paths, notebook_paths
from chapters.code_links import definition_line

CHAPTERS = chapter_paths()
SECTIONS = ["## The idea", "## The code", "## What the trace shows", "## Experiments", "## Exercises"]
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
SCHEMA_NAMES = {v for c in (SpanName, EventName) for k, v in vars(c).items() if k.isupper()}


def _ids(paths):
    return [p.stem for p in paths]


def _text(chapter: Path) -> str:
    return chapter.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    start = text.index(heading) + len(heading)
    following = [m.start() for m in re.finditer(r"^## ", text[start:], re.M)]
    return text[start:start + following[0]] if following else text[start:]


def test_chapters_and_notebooks_pair_up():
    assert [p.stem for p in CHAPTERS] == [p.stem for p in notebook_paths()]
    numbers = [int(p.stem[:2]) for p in CHAPTERS]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 12


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_ids(CHAPTERS))
def test_title_sections_and_own_notebook(chapter):
    text = _text(chapter)
    number = int(chapter.stem[:2])
    assert re.match(rf"# {number}\. \S", text.splitlines()[0]), "the first line is '# N. Title'"
    positions = [text.find(s + "\n") for s in SECTIONS]
    assert -1 not in positions, f"missing sections: {[s for s, p in zip(SECTIONS, positions) if p < 0]}"
    assert positions == sorted(positions), f"sections out of order: {SECTIONS}"
    own = [target for _, target in LINK.findall(text) if target == f"../notebooks/{chapter.stem}.ipynb"]
    assert len(own) == 1, "a chapter links its own notebook exactly once"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_ids(CHAPTERS))
def test_links_resolve_and_code_names_exist(chapter):
    for label, target in LINK.findall(_text(chapter)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (chapter.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{chapter.name}: [{label}]({target}) points at nothing"
        name = re.fullmatch(r"`([A-Za-z_][\w.]*)`", label)
        if path.suffix == ".py" and name and not name.group(1).endswith(".py"):
            assert definition_line(path.read_text(encoding="utf-8"), name.group(1)) is not None, (
                f"{chapter.name}: {name.group(1)} is not defined in {target}")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_ids(CHAPTERS))
def test_trace_table_names_are_in_the_schema(chapter):
    section = _section(_text(chapter), "## What the trace shows")
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) >= 3, "the section starts with a table (header, rule, rows)"
    names = []
    for row in rows[2:]:
        names += re.findall(r"`([^`]+)`", row.split("|")[1])
    assert names, "the table's first column names spans or events"
    unknown = sorted(set(names) - SCHEMA_NAMES)
    assert not unknown, f"{chapter.name}: not span or event names of tracevllm/tracing/schema.py: {unknown}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_ids(CHAPTERS))
def test_pictures_exist_and_are_drawn_by_the_notebook(chapter):
    text = _text(chapter)
    images = IMAGE.findall(text)
    for target in images:
        assert (chapter.parent / target).is_file(), f"{chapter.name}: missing picture {target}"
    own = [t for t in images if re.fullmatch(rf"images/{chapter.stem[:2]}-[\w.-]+\.png", t)]
    assert own, f"{chapter.name} shows no picture of its own (images/{chapter.stem[:2]}-*.png)"
    notebook_source = (REPO / "notebooks" / f"{chapter.stem}.ipynb").read_text(encoding="utf-8")
    for target in own:
        assert Path(target).name in notebook_source, f"{target} is not written by notebooks/{chapter.stem}.ipynb"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_ids(CHAPTERS))
def test_exercises_have_collapsed_answers(chapter):
    exercises = _section(_text(chapter), "## Exercises")
    answers = exercises.count("<details><summary>Answer</summary>")
    assert 2 <= answers <= 4 and exercises.count("</details>") == answers


@pytest.mark.parametrize("notebook", notebook_paths(), ids=_ids(notebook_paths()))
def test_notebooks_are_committed_without_outputs(notebook):
    nb = nbformat.read(notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
