"""The committed chapter pictures (chapters/images) are what the notebooks draw today: each notebook,
executed once per session (tests/book/conftest.py), draws into its own folder, and every picture its
chapter shows is compared with the committed one (chapters/pictures.py: pixels, or for a picture
of measured times its size and colours). A change to the drawing code fails here until the pictures
are refreshed with ``python -m chapters.pictures``."""

from __future__ import annotations

import pytest

from chapters.book import REPO, chapter_paths
from chapters.pictures import REFRESH, stale_pictures

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chapter", [p.stem for p in chapter_paths()])
def test_committed_pictures_match_a_fresh_render(chapter, run_notebook, figures):
    run_notebook(f"{chapter}.ipynb")
    stale = stale_pictures(REPO, figures, [chapter])
    assert not stale, (f"chapters/images is stale: {stale}; refresh it with `{REFRESH} {chapter[:2]}` "
                       f"(or `{REFRESH}` for every chapter) and commit the pictures")
