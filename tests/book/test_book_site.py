"""The book builds (Jupyter Book, from the executed notebooks) and works in a real headless browser:
Chromium from the system's packages (``.ci/run`` installs it), driven by Selenium. The landing page,
chapter 0 with its pictures and links, a code link that lands on its definition, and a notebook
page that shows its outputs."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from chapters.book import REPO, build_html, notebook_paths

pytestmark = pytest.mark.slow


def _local_path(url: str) -> Path:
    return Path(unquote(urlparse(url).path))


def _images(browser) -> list[tuple[str, bool, str | None]]:
    """Each picture of the page: its source, whether it loaded, and the link around it."""
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('article img'))"
        ".map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0, i.closest('a') && i.closest('a').href])")


@pytest.fixture(scope="module")
def site(book_src, run_notebook) -> Path:
    for notebook in notebook_paths():
        run_notebook(notebook.name)  # already run by test_book_notebooks.py, usually
    return build_html(book_src).parent


def test_landing_page(site, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get((site / "index.html").as_uri())
    # index.html redirects (a meta refresh) to the landing page, chapters/README; get() may return
    # before the browser follows it.
    heading = WebDriverWait(browser, 30).until(
        lambda b: b.execute_script("const h = document.querySelector('article h1'); return h && h.textContent"))
    assert browser.current_url.endswith("chapters/README.html"), browser.current_url
    assert heading.startswith("tracevllm")
    images = _images(browser)
    assert images and all(loaded for _, loaded, _ in images), images
    text = browser.execute_script("return document.querySelector('article').textContent")
    for needed in ("Before you start", "make run", "make test", "What you will learn", "Glossary",
                   "EngineCoreRequest", "SchedulerOutput"):
        assert needed in text
    # The page's own scripts run without an error (sphinx-thebe's declared its constants twice).
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "SyntaxError" in e["message"]]
    assert not errors, errors


def test_chapter_0_renders(site, browser):
    browser.get((site / "chapters" / "00-the-map.html").as_uri())
    heading = browser.execute_script("return document.querySelector('article h1').textContent")
    assert heading.startswith("0.")
    images = _images(browser)
    assert any("00-" in src for src, _, _ in images), "chapter 0 shows its own picture"
    assert all(loaded for _, loaded, _ in images), f"pictures that did not load: {images}"
    # Each picture links to itself at full size, for when the column is too narrow to read it.
    assert all(link and link.endswith(Path(src).name) for src, _, link in images), images

    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('article a[href]')).map(a => a.href)")
    local = [url for url in links if url.startswith("file:")]
    missing = [url for url in local if not _local_path(url).is_file()]
    assert not missing, f"links of chapter 0 that resolve to nothing: {missing}"
    assert any("/code/tracevllm/" in url for url in local), "chapter 0 links the code"


def test_code_link_lands_on_its_definition(site, browser):
    browser.get((site / "chapters" / "04-scheduler.html").as_uri())
    url = browser.execute_script(
        "const a = Array.from(document.querySelectorAll('article a')).find(a => a.textContent === 'Scheduler.schedule');"
        "return a.href")
    assert "/code/tracevllm/core/sched/scheduler.py.html#" in url
    browser.get(url)
    first_line, top = browser.execute_script(
        "const e = document.getElementById(location.hash.slice(1));"
        "return [e.querySelector('pre').textContent.split('\\n')[0], e.getBoundingClientRect().top]")
    line = next(i for i, text in enumerate((REPO / "tracevllm/core/sched/scheduler.py").read_text().splitlines(), 1)
                if text.startswith("    def schedule("))
    assert re.fullmatch(rf"{line}\s+def schedule\(.*", first_line.strip()), first_line
    assert 0 <= top < 200, "the browser scrolled to the definition"


def test_notebook_pages_show_their_outputs(site, browser):
    browser.get((site / "notebooks" / "04-scheduler.html").as_uri())
    outputs = browser.execute_script(
        "return Array.from(document.querySelectorAll('article .cell_output')).map(o => o.textContent.trim())")
    assert any("54 prompt tokens" in text for text in outputs), "the executed cells' printed output"
    images = _images(browser)
    assert images and all(loaded for _, loaded, _ in images), "the pictures the notebook drew"


def test_quoted_output_fits_the_column(site, browser):
    """Chapter 12's ``traces explain`` output, a text block, shows whole: no scroll bar, nothing cut."""
    browser.get((site / "chapters" / "12-why.html").as_uri())
    blocks = browser.execute_script(
        "return Array.from(document.querySelectorAll('article div.highlight-text pre'))"
        ".map(p => [p.scrollWidth, p.clientWidth, p.textContent.slice(0, 40)])")
    assert blocks and all(scroll <= client for scroll, client, _ in blocks), blocks
