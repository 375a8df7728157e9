"""``viz/palette.py`` is the one palette: no other file writes its colours out (a figure, the report,
a notebook and the live page all take them from it), and the live page is served the same values."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from matplotlib.colors import TABLEAU_COLORS, to_hex

from tracevllm.entrypoints.ui import mount_ui
from viz.explain import PARTS
from viz.palette import FREE_BLOCK, PART_COLOURS, PHASE_COLOURS, WAITING
from viz.plots.style import colour_distance

REPO = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".js", ".css", ".html", ".ipynb", ".md", ".toml", ".yml", ".yaml"}
PALETTE = {c.lower() for c in [*PHASE_COLOURS.values(), WAITING, FREE_BLOCK, *PART_COLOURS.values()]} - {"#000000"}
# The same colours by a matplotlib name: tab:blue is prefill's blue, and C0 is tab:blue.
NAMES = {name for name, colour in TABLEAU_COLORS.items() if to_hex(colour) in PALETTE}
NAMES |= {f"C{i}" for i, name in enumerate(TABLEAU_COLORS) if name in NAMES}
WRITTEN = re.compile("|".join([*map(re.escape, PALETTE), *(rf"""["']{re.escape(n)}\\?["']""" for n in NAMES)]), re.I)
# Notebooks whose own pictures use matplotlib's categorical colours for what is not a phase (a process,
# a stage, a block): known debt, to be re-coloured from viz/palette.py when their pictures are next
# refreshed (python -m chapters.pictures 01 02 03 07 08). No other file may join this list.
CATEGORICAL = {"notebooks/01-entry-points.ipynb", "notebooks/02-processor.ipynb", "notebooks/03-engine-core.ipynb",
               "notebooks/07-attention.ipynb", "notebooks/08-sampling.ipynb"}


def _files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    return [REPO / p for p in listed if Path(p).suffix in SUFFIXES and (REPO / p).is_file()]


def test_no_file_but_the_palette_writes_its_colours():
    found = []
    for path in _files():
        if path == REPO / "viz" / "palette.py" or str(path.relative_to(REPO)) in CATEGORICAL:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if WRITTEN.search(line) and "image/png" not in line:
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not found, "a palette colour written out (take it from viz/palette.py):\n" + "\n".join(found)


def test_every_part_has_its_own_colour_and_a_request_s_own_work_has_its_phase_s():
    assert list(PART_COLOURS) == list(PARTS)
    assert (PART_COLOURS["prefill"], PART_COLOURS["decode"]) == (PHASE_COLOURS["prefill"], PHASE_COLOURS["decode"])
    assert PART_COLOURS["preempted.waiting"] == PHASE_COLOURS["preempted"]
    for (a, x), (b, y) in itertools.combinations(PART_COLOURS.items(), 2):
        assert colour_distance(x, y) >= 10, (a, b)  # CIE76: about 2.3 is the least an eye sees


def test_the_live_page_is_served_the_palette():
    app = FastAPI()
    mount_ui(app)
    client = TestClient(app)
    css, js, page = (client.get(f"/ui{path}") for path in ("/palette.css", "/palette.js", ""))
    assert css.status_code == js.status_code == page.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
    assert js.headers["content-type"].startswith("text/javascript")
    for phase, colour in PHASE_COLOURS.items():
        assert f"--{phase}: {colour};" in css.text and f'"{phase}": "{colour}"' in js.text
    assert f"--waiting: {WAITING};" in css.text and f'export const WAITING = "{WAITING}";' in js.text
    assert '<link rel="stylesheet" href="/ui/palette.css">' in page.text
