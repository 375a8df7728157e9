"""The book's landing page (chapters/README.md, which GitHub also shows for the folder): what a
learner needs before the first chapter."""

from __future__ import annotations

import re

from chapters.book import REPO, chapter_paths
from chapters.code_links import definition_line

LANDING = REPO / "chapters" / "README.md"


def _section(heading: str) -> str:
    text = LANDING.read_text(encoding="utf-8")
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_prerequisites_and_the_two_commands():
    assert "Python ≥ 3.10" in _section("Before you start")
    commands = _section("Two commands")
    assert re.search(r"^make run\b", commands, re.M) and re.search(r"^make test\b", commands, re.M)


def test_hero_picture_is_a_committed_chapter_picture():
    pictures = re.findall(r"!\[[^\]]+\]\((images/[\w.-]+\.png)\)", LANDING.read_text(encoding="utf-8"))
    assert pictures and (LANDING.parent / pictures[0]).is_file()


def test_what_you_will_learn_links_every_chapter_in_order():
    links = re.findall(r"\]\((\d\d-[\w-]+\.md)\)", _section("What you will learn"))
    assert links == [p.name for p in chapter_paths()]


def test_glossary_names_the_types_of_chapter_0_each_linked_to_its_definition():
    rows = re.findall(r"^\| \[`(\w+)`\]\(\.\./([\w/.]+\.py)\) \| (.+) \|$", _section("Glossary"), re.M)
    assert len(rows) >= 25
    for name, path, meaning in rows:
        assert definition_line((REPO / path).read_text(encoding="utf-8"), name), f"{name} is not defined in {path}"
        assert len(meaning) > 20
    chapter_0 = (REPO / "chapters" / "00-the-map.md").read_text(encoding="utf-8")
    for name in ("EngineCoreRequest", "Request", "SchedulerOutput", "ModelRunnerOutput", "SamplerOutput",
                 "EngineCoreOutput", "OutputProcessor", "RequestOutput"):
        assert f"`{name}`" in chapter_0 and name in {n for n, _, _ in rows}


def test_the_hero_picture_s_caption_says_what_each_of_its_rows_is():
    """The landing page's picture comes before chapter 0: its caption says, in plain words, what each
    row label (a span's name, ``viz/plots/waterfall.py``) is."""
    text = LANDING.read_text(encoding="utf-8")
    caption = text[text.index("](images/00-one-request.png)"):text.index("\n## ")]
    for label in ("llm_request", "tokenize", "scheduler.request", "prefill", "decode", "detokenize",
                  "execute_model", "(core)"):
        assert re.search(rf"[(`\"]{re.escape(label)}[)`\"]", caption), label


def test_a_ten_minute_path_notebook_0_then_12_on_the_landing_page_and_in_the_readme():
    landing = re.findall(r"\]\(\.\./notebooks/(\d\d)-[\w-]+\.ipynb\)", _section("If you have ten minutes"))
    assert landing == ["00", "12"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    path = readme[readme.index("**If you have ten minutes:**"):]
    path = path[:path.index("\n\n")]
    assert re.findall(r"\]\(notebooks/(\d\d)-[\w-]+\.ipynb\)", path) == ["00", "12"]
