"""chapters/pictures.py: notebooks draw into $TRACEVLLM_FIGURES (or a temp folder), never into the
committed chapters/images, and a committed picture is told apart from a fresh render by its pixels.
(The comparison with fresh renders of every notebook is tests/book/test_chapter_pictures.py.)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
import numpy as np
import pytest
from PIL import Image

from chapters.book import REPO, notebook_paths
from chapters.pictures import FIGURES_ENV, TIMED, chapter_pictures, difference, figures_dir


def test_figures_dir_is_the_variable_else_a_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(FIGURES_ENV, str(tmp_path / "figures"))
    assert figures_dir() == tmp_path / "figures" and (tmp_path / "figures").is_dir()
    monkeypatch.delenv(FIGURES_ENV)
    default = figures_dir()
    assert default.parent == Path(tempfile.gettempdir()) and REPO not in default.parents


@pytest.mark.parametrize("notebook", notebook_paths(), ids=[p.stem for p in notebook_paths()])
def test_notebooks_save_pictures_into_figures_dir(notebook):
    source = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
    assert "chapters/images" not in source, "a notebook must not write the committed pictures"
    assert "FIGURES = figures_dir()" in source
    for name in chapter_pictures(REPO)[notebook.stem]:
        assert f'"{name}"' in source, f"{name} is not saved by {notebook.name}"


def test_timed_pictures_are_chapter_pictures():
    pictures = {name for names in chapter_pictures(REPO).values() for name in names}
    assert TIMED <= pictures and len(pictures) >= 20


def _picture(path: Path, pixels: np.ndarray) -> Path:
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def _chart(width=400, height=200, bar=(0, 100), colour=(31, 119, 180)) -> np.ndarray:
    pixels = np.full((height, width, 3), 255)
    pixels[80:120, 50 + bar[0]:50 + bar[1]] = colour
    return pixels


def test_a_picture_equal_to_its_render_passes_and_any_change_is_named(tmp_path):
    committed = _picture(tmp_path / "04-preemption-step4.png", _chart())
    assert difference(committed, _picture(tmp_path / "same.png", _chart())) is None
    moved = difference(committed, _picture(tmp_path / "moved.png", _chart(bar=(10, 110))))
    assert moved and "pixels differ" in moved
    recoloured = difference(committed, _picture(tmp_path / "recoloured.png", _chart(colour=(214, 39, 40))))
    assert recoloured and "pixels differ" in recoloured
    resized = difference(committed, _picture(tmp_path / "resized.png", _chart(width=300)))
    assert resized and "size 400x200" in resized


def test_a_timed_picture_may_move_its_bars_but_not_change_its_colours_or_size(tmp_path):
    assert "04-preemption-timeline.png" in TIMED
    committed = _picture(tmp_path / "04-preemption-timeline.png", _chart())
    assert difference(committed, _picture(tmp_path / "moved.png", _chart(bar=(10, 120)))) is None
    # a bar covering 0.25% of the picture in one and 0.15% in the other is the same colour still
    assert difference(_picture(tmp_path / "04-preemption-timeline.png", _chart(bar=(0, 5))),
                      _picture(tmp_path / "shorter.png", _chart(bar=(0, 3)))) is None
    recoloured = difference(committed, _picture(tmp_path / "recoloured.png", _chart(colour=(214, 39, 40))))
    assert recoloured and "colours" in recoloured
    assert "size" in difference(committed, _picture(tmp_path / "smaller.png", _chart(width=300)))
