"""Every notebook runs top to bottom on the bundled model: its assertions are the chapter's claims
about the engine, so a change that makes a chapter wrong fails here."""

from __future__ import annotations

import pytest

from viz.book import notebook_paths

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [p.name for p in notebook_paths()])
def test_notebook_runs(name, run_notebook):
    seconds = run_notebook(name)
    print(f"{name}: {seconds:.1f} s")
