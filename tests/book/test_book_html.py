"""``chapters.book.build_html`` on a book of two pages, built in seconds: the configuration it writes
gives pages whose scripts run without an error: no name declared twice with ``const`` or ``let``
among a page's scripts, a SyntaxError in its console (``var`` may be declared again)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from chapters.book import build_html

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("tiny-book") / "src"
    (src / "chapters").mkdir(parents=True)
    (src / "docs").mkdir()
    (src / "chapters" / "README.md").write_text("# A tiny book\n\nThe landing page.\n", encoding="utf-8")
    (src / "chapters" / "00-one.md").write_text("# 0. One\n\nA chapter.\n", encoding="utf-8")
    (src / "docs" / "reference.md").write_text("# Reference\n\nA reference page.\n", encoding="utf-8")
    (src / "README.md").write_text("# The repository\n\nIts README.\n", encoding="utf-8")
    return build_html(src).parent


def test_no_page_declares_a_constant_twice(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 4
    for page in pages:
        inline = "\n".join(re.findall(r"<script>(.+?)</script>", page.read_text(encoding="utf-8"), re.S))
        declared = Counter(re.findall(r"\b(?:const|let)\s+([A-Za-z_$][\w$]*)\s*=", inline))
        twice = [name for name, n in declared.items() if n > 1]
        assert not twice, f"{page.relative_to(site)} declares {twice} twice"
    assert "THEBE_JS_URL" not in (site / "chapters" / "00-one.html").read_text(encoding="utf-8")
