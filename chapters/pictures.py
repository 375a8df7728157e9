"""The chapters' pictures: where the notebooks write them, and ``python -m chapters.pictures``, the
one command that refreshes the committed ones in ``chapters/images``.

A notebook saves each picture it draws into ``figures_dir()``: ``$TRACEVLLM_FIGURES`` when it is set
(the book build, this script and the tests set it), else a folder in the system's temp dir. Running
a notebook by hand therefore never rewrites a tracked picture.

The pictures are drawn from real runs of the engine, many by the notebook's own code, so a fresh
picture can only come from executing its notebook. The script does that in a staged copy (the
tracked notebooks are not rewritten either), then copies the pictures that differ into
``chapters/images``; ``--check`` only compares. Pictures that plot measured times (``TIMED``) differ a little from run
to run, so a check compares their size and colours (the layout, the labels, the palette), and every
other picture pixel by pixel.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

FIGURES_ENV = "TRACEVLLM_FIGURES"
REFRESH = "python -m chapters.pictures"
# Pictures whose axes or bars are measured times (or are laid out from them): a fresh run moves them.
TIMED = frozenset({
    "00-one-request.png", "00-timeline.png", "01-spans-per-process.png", "02-tokenize-and-request.png",
    "03-step-stages.png", "03-two-processes.png", "04-preemption-timeline.png", "07-execute-model.png",
    "08-step-stages.png", "09-finish-timeline.png", "10-served-requests.png", "11-gauges.png",
    "11-timeline.png", "12-long-prompt-ahead.png", "12-why.png", "13-whatif.png", "13-whatif-overlay.png",
    "14-two-engines.png", "14-why.png", "14-whatif.png",
})
_OWN_PICTURE = re.compile(r"!\[[^\]]*\]\(images/(\d\d-[\w.-]+\.png)\)")


def figures_dir() -> Path:
    """The folder a notebook saves its pictures in (created): ``$TRACEVLLM_FIGURES``, else
    ``<temp dir>/tracevllm-figures``."""
    path = Path(os.environ.get(FIGURES_ENV) or Path(tempfile.gettempdir()) / "tracevllm-figures")
    path.mkdir(parents=True, exist_ok=True)
    return path


def chapter_pictures(repo: Path) -> dict[str, list[str]]:
    """Chapter stem -> the pictures of its own that it shows (``images/NN-*.png``), which its
    notebook draws."""
    from chapters.book import chapter_paths

    return {c.stem: _OWN_PICTURE.findall(c.read_text(encoding="utf-8")) for c in chapter_paths(repo)}


def difference(committed: Path, fresh: Path) -> str | None:
    """Why ``committed`` is not what a fresh render drew (``fresh``), or None when it is.

    Pixels are compared after decoding (PNG bytes depend on the encoder). A picture of measured
    times (``TIMED``) may move its bars and ticks; it must keep its size (within 2%) and its colours.
    """
    a, b = (np.asarray(Image.open(p).convert("RGB"), dtype=np.int16) for p in (committed, fresh))
    if committed.name in TIMED:
        (ha, wa), (hb, wb) = a.shape[:2], b.shape[:2]
        if abs(ha - hb) > 0.02 * max(ha, hb) or abs(wa - wb) > 0.02 * max(wa, wb):
            return f"size {wa}x{ha} px, a fresh render is {wb}x{hb}"
        # A colour must cover 0.2% of one picture and be all but absent (under 0.05%) from the other,
        # so that a bar of measured length that crosses 0.2% does not count.
        missing = (_colours(a) - _colours(b, 0.0005)) | (_colours(b) - _colours(a, 0.0005))
        if missing:
            return f"colours {sorted(missing)[:4]} are in only one of the committed and the fresh picture"
        return None
    if a.shape != b.shape:
        return f"size {a.shape[1]}x{a.shape[0]} px, a fresh render is {b.shape[1]}x{b.shape[0]}"
    changed = float((np.abs(a - b).max(axis=2) > 24).mean())
    return f"{changed:.2%} of its pixels differ from a fresh render" if changed > 0.001 else None


def _colours(pixels: np.ndarray, share: float = 0.002) -> set[str]:
    """The colours (quantised to 32 levels a channel) that cover at least ``share`` of the picture."""
    quantised = (pixels // 8).reshape(-1, 3)
    values, counts = np.unique(quantised, axis=0, return_counts=True)
    return {"#{:02x}{:02x}{:02x}".format(*(v * 8)) for v in values[counts >= share * len(quantised)]}


def stale_pictures(repo: Path, figures: Path, chapters: list[str] | None = None) -> dict[str, str]:
    """Picture -> why the committed one in ``repo/chapters/images`` is not what was just drawn into
    ``figures`` (by the notebooks of ``chapters``, every chapter by default)."""
    stale = {}
    for chapter, names in chapter_pictures(repo).items():
        if chapters is not None and chapter not in chapters:
            continue
        for name in names:
            fresh, committed = figures / name, repo / "chapters" / "images" / name
            if not fresh.is_file():
                stale[name] = f"notebooks/{chapter}.ipynb did not draw it"
            elif not committed.is_file():
                stale[name] = "not committed"
            else:
                why = difference(committed, fresh)
                if why:
                    stale[name] = why
    return stale


def render(out: Path, chapters: list[str], repo: Path) -> Path:
    """Execute the notebooks of ``chapters`` in a copy staged under ``out``; returns the folder their
    pictures were drawn in."""
    from chapters.book import execute_notebook, stage

    src = stage(out / "src", repo)
    figures = out / "figures"
    for chapter in chapters:
        print(f"executing notebooks/{chapter}.ipynb ...", flush=True)
        execute_notebook(src / "notebooks" / f"{chapter}.ipynb", figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    from chapters.book import REPO

    parser = argparse.ArgumentParser(prog=REFRESH, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("chapters", nargs="*", metavar="NN",
                        help="chapter numbers (e.g. 04 11); default: every chapter")
    parser.add_argument("--check", action="store_true",
                        help="only say which committed pictures differ from a fresh render (exit 1 if any)")
    args = parser.parse_args(argv)
    pictures = chapter_pictures(REPO)
    chapters = [c for c in pictures if not args.chapters or c[:2] in {n.zfill(2) for n in args.chapters}]
    if not chapters:
        parser.error(f"no chapter numbered {' '.join(args.chapters)}; there are {', '.join(c[:2] for c in pictures)}")
    with tempfile.TemporaryDirectory(prefix="tracevllm-chapter-images-") as out:
        figures = render(Path(out), chapters, REPO)
        stale = stale_pictures(REPO, figures, chapters)
        for name, why in stale.items():
            print(f"{name}: {why}")
        if args.check:
            return 1 if stale else 0
        # Only the stale ones: a timed picture that still matches is not churned by a new run's times.
        refreshed = [name for name in stale if (figures / name).is_file()]
        for name in refreshed:
            shutil.copy2(figures / name, REPO / "chapters" / "images" / name)
    print(f"refreshed {len(refreshed)} of {sum(len(pictures[c]) for c in chapters)} pictures in chapters/images")
    return 0 if len(refreshed) == len(stale) else 1


if __name__ == "__main__":
    sys.exit(main())
