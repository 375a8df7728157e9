"""The book builds (Jupyter Book, from the executed notebooks) and its chapter 0 works in a real
headless browser: Chromium from the system's packages (``.ci/run`` installs it), driven by Selenium."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from viz.book import build_html, notebook_paths

pytestmark = pytest.mark.slow



def _local_path(url: str) -> Path:
    return Path(unquote(urlparse(url).path))


def test_book_builds_and_chapter_0_renders(book_src, run_notebook, browser):
    for notebook in notebook_paths():
        run_notebook(notebook.name)  # already run by test_book_notebooks.py, usually
    index = build_html(book_src)
    site = index.parent
    chapter = site / "chapters" / "00-the-map.html"
    assert chapter.is_file()

    browser.get(chapter.as_uri())
    heading = browser.execute_script("return document.querySelector('article h1').textContent")
    assert heading.startswith("0.")

    images = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img'))"
        ".map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])")
    assert any("00-" in src for src, _ in images), "chapter 0 shows its own picture"
    assert all(loaded for _, loaded in images), f"pictures that did not load: {[s for s, ok in images if not ok]}"

    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('article a[href]')).map(a => a.href)")
    local = [url for url in links if url.startswith("file:")]
    missing = [url for url in local if not _local_path(url).is_file()]
    assert not missing, f"links of chapter 0 that resolve to nothing: {missing}"
    code = [url for url in local if "/code/tracevllm/" in url]
    assert code, "chapter 0 links the code"
    browser.get(code[0])
    source = browser.execute_script("return document.querySelector('article pre').textContent")
    assert "import" in source or "def " in source or "class " in source
