"""A chapter's code quotes are the code as it is.

The rule (chapters/ follows it): a code block (not a shell block) whose paragraph just before it
links source files (``[...](../tracevllm/x.py)``, ``[...](../viz/y.py)``) quotes one of those files.
``...``, on a line of its own or within a line, stands for what the quote leaves out. With comments
(``#`` to the end of a line) dropped and all whitespace counted as one space, the pieces between the
``...`` appear in that file, in order. A comment in a quote is the chapter's own; any code is the
file's.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.book.chapter_blocks import code_blocks
from chapters.book import REPO, chapter_paths

CHAPTERS = chapter_paths()
SHELL = {"bash", "sh", "console", "shell"}
SOURCE_LINK = re.compile(r"\]\((\.\./(?:tracevllm|viz)/[^)\s#]+\.py)")
COMMENT = re.compile(r"(^|\s)#.*$", re.M)


def _normal(code: str) -> str:
    return re.sub(r"\s+", " ", COMMENT.sub(r"\1", code)).strip()


def _in_order(pieces: list[str], source: str) -> str | None:
    """The first piece not found in ``source`` after the one before it, or None when all are."""
    start = 0
    for piece in pieces:
        at = source.find(piece, start)
        if at < 0:
            return piece
        start = at + len(piece)
    return None


def stale_quotes(chapter: Path) -> tuple[int, list[str]]:
    """How many quotes the chapter has, and one message for each that none of its files holds."""
    count, stale = 0, []
    for block in code_blocks(chapter.read_text(encoding="utf-8")):
        files = sorted(set(SOURCE_LINK.findall(block.paragraph)))
        if block.language in SHELL or not files:
            continue
        count += 1
        pieces = [p for p in (_normal(part) for part in block.code.split("...")) if p]
        missing = [_in_order(pieces, _normal((chapter.parent / f).read_text(encoding="utf-8"))) for f in files]
        if all(missing):
            stale.append(f"{chapter.name}:{block.line}: the quote of {' or '.join(f[3:] for f in files)} no longer "
                         f"matches it, from: {min(missing, key=len)[:120]!r}")
    return count, stale


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_code_quotes_match_their_files(chapter):
    _, stale = stale_quotes(chapter)
    assert not stale, "\n".join(stale)


def test_the_chapters_quote_code():
    """The rule sees the quotes: a change of how chapters mark them would otherwise pass unchecked."""
    assert sum(stale_quotes(c)[0] for c in CHAPTERS) >= 18  # 20 when this was written


def test_a_stale_quote_is_caught(tmp_path):
    """Chapter 4 quotes Scheduler.schedule; in a copy where that code has changed, the quote is stale."""
    chapter = tmp_path / "chapters" / "04-scheduler.md"
    source = tmp_path / "tracevllm" / "core" / "sched" / "scheduler.py"
    chapter.parent.mkdir()
    source.parent.mkdir(parents=True)
    shutil.copy(REPO / "chapters" / "04-scheduler.md", chapter)
    shutil.copy(REPO / "tracevllm" / "core" / "sched" / "scheduler.py", source)
    for name in ("step_batch.py", "request_queue.py"):
        shutil.copy(REPO / "tracevllm" / "core" / "sched" / name, source.parent / name)
    assert stale_quotes(chapter)[1] == []
    code = source.read_text()
    source.write_text(code.replace("alone = len(self.running) + len(self.waiting) <= 1",
                                   "alone = not self.waiting and len(self.running) <= 1"))
    (stale,) = stale_quotes(chapter)[1]
    assert re.match(r"04-scheduler\.md:\d+: the quote of tracevllm/core/sched/scheduler\.py no longer matches it, "
                    r"from: 'alone = len\(self\.running\)", stale), stale
