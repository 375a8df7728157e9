"""What a chapter quotes as text (a program's output, a formula: its ``text`` blocks) fits the book's
column without a scroll bar: 76 characters of its code font in the 676-px column (the built book's
browser test checks the same blocks for overflow). Output lines too long are wrapped, with the
continuation indented, and say so."""

from __future__ import annotations

import re

import pytest

from chapters.book import chapter_paths

CODE_COLUMN_CHARS = 76
TEXT_BLOCK = re.compile(r"^( *)```text\n(.*?)^ *```", re.S | re.M)


@pytest.mark.parametrize("chapter", chapter_paths(), ids=lambda p: p.stem)
def test_text_blocks_fit_the_column(chapter):
    for block in TEXT_BLOCK.finditer(chapter.read_text(encoding="utf-8")):
        indent = len(block.group(1))
        wide = [line[indent:] for line in block.group(2).splitlines() if len(line) - indent > CODE_COLUMN_CHARS]
        assert not wide, f"{chapter.name}: lines over {CODE_COLUMN_CHARS} characters: {wide}"
