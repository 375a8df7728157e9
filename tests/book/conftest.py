"""The book's sources staged once per session, and each notebook executed there at most once: the
notebook tests run them, the site test builds the book from the same executed copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from viz.book import execute_notebook, stage


@pytest.fixture(scope="session")
def book_src(tmp_path_factory) -> Path:
    return stage(tmp_path_factory.mktemp("book") / "src")


@pytest.fixture(scope="session")
def run_notebook(book_src):
    """``run_notebook(name)`` -> seconds: executes ``notebooks/<name>`` in the staged copy (pictures go
    to the staged ``chapters/images``), once; a notebook that failed fails every later call too."""
    results: dict[str, float | BaseException] = {}

    def run(name: str) -> float:
        if name not in results:
            try:
                results[name] = execute_notebook(book_src / "notebooks" / name)
            except Exception as e:  # noqa: BLE001 - kept and re-raised for every caller
                results[name] = e
        result = results[name]
        if isinstance(result, BaseException):
            raise result
        return result

    return run
