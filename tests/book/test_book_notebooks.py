"""Every notebook runs top to bottom on the bundled model: its assertions are the chapter's claims
about the engine, so a change that makes a chapter wrong fails here. And no notebook opens with a
warning: a learner's first cell builds an LLM and shows nothing but what it prints."""

from __future__ import annotations

import re

import nbformat
import pytest

from chapters.book import REPO, execute_notebook, notebook_paths

pytestmark = pytest.mark.slow

# A Python warning as the warnings module prints it: "...py:21: TqdmWarning: IProgress not found..."
WARNING = re.compile(r"\b\w*Warning: ")


def _warnings(notebook) -> list[str]:
    return [output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.outputs if WARNING.search(output.get("text", ""))]


@pytest.mark.parametrize("name", [p.name for p in notebook_paths()])
def test_notebook_runs(name, run_notebook, book_src):
    seconds = run_notebook(name)
    print(f"{name}: {seconds:.1f} s")
    assert not _warnings(nbformat.read(book_src / "notebooks" / name, as_version=4))


def test_the_first_cell_builds_an_llm_without_a_warning(tmp_path):
    """Notebook 0's first cell alone (imports, then ``LLM()``). transformers imports ``tqdm.auto``,
    which in a kernel without ipywidgets warns ``TqdmWarning: IProgress not found``: the test extra
    installs ipywidgets."""
    notebook = nbformat.read(REPO / "notebooks" / "00-the-map.ipynb", as_version=4)
    notebook.cells = [next(c for c in notebook.cells if c.cell_type == "code")]
    assert "LLM(" in notebook.cells[0].source
    path = tmp_path / "first-cell.ipynb"
    nbformat.write(notebook, path)
    execute_notebook(path, tmp_path / "figures")
    assert not _warnings(nbformat.read(path, as_version=4))
