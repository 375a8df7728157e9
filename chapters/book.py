"""``python -m chapters.book [-o build/book]``: the learner's book, built into a static HTML site.

The book is ``chapters/`` (one Markdown chapter per stage of a request's path) and ``notebooks/`` (one
notebook per chapter), built with Jupyter Book in three steps:

1. **Stage** a copy of what the book shows under ``OUT/src``: the landing page
   (``chapters/README.md``), the chapters and their pictures (each linked to its full size), the
   notebooks and the reference docs. A chapter's link to a source file (``../tracevllm/....py``,
   which works on GitHub) is pointed at a page of the book that shows that file, numbered and
   highlighted, at the definition the link names (``chapters/code_links.py``).
2. **Execute** every notebook there with nbclient, in its own folder. Each notebook runs the real
   engine, replays its trace and redraws its chapter's pictures into ``$TRACEVLLM_FIGURES``, here
   the staged ``chapters/images``, so the book shows this run's pictures and outputs, and a notebook
   whose assertions fail stops the build. (The committed pictures are refreshed by
   ``python -m chapters.pictures``, never by the book.)
3. **Build** the HTML (``jupyter-book build``, notebooks not executed again) into ``OUT/_build/html``.

The tests (``tests/book/``) use the same steps: they execute the notebooks one by one and then build
the book from them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from chapters.code_links import link_code, write_code_page
from chapters.pictures import FIGURES_ENV

REPO = Path(__file__).resolve().parents[1]
TITLE = "tracevllm: one request, every stage"
# Copied beside the chapters so that their links resolve inside the book.
_CODE_DIRS = ("tracevllm", "viz")
_REFERENCE_DOCS = ("README.md", "docs")
# A picture on a line of its own: ![alt](images/00-timeline.png)
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)\s]+)\)$", re.M)


def chapter_paths(repo: Path = REPO) -> list[Path]:
    """The chapters in reading order: ``chapters/NN-*.md``."""
    return sorted((repo / "chapters").glob("[0-9][0-9]-*.md"))


def notebook_paths(repo: Path = REPO) -> list[Path]:
    return sorted((repo / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def stage(src: Path, repo: Path = REPO) -> Path:
    """Copy the book's sources into ``src`` (emptied first); returns ``src``."""
    if not (repo / "chapters").is_dir():
        raise ValueError(f"{repo} has no chapters/: the book is built from a checkout of tracevllm")
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    shutil.copytree(repo / "chapters", src / "chapters", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copytree(repo / "notebooks", src / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for name in _REFERENCE_DOCS:
        path = repo / name
        if path.is_dir():
            shutil.copytree(path, src / name)
        else:
            shutil.copy2(path, src / name)
    for name in _CODE_DIRS:
        shutil.copytree(repo / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    linked: dict[str, set[str]] = {}
    for page in [src / "chapters" / "README.md", *chapter_paths(src)]:
        text, names = link_code(page.read_text(encoding="utf-8"), src)
        for code_path, found in names.items():
            linked.setdefault(code_path, set()).update(found)
        page.write_text(_IMAGE.sub(_enlargeable, text), encoding="utf-8")
    for code_path, names in linked.items():
        write_code_page(src, code_path, names)
    return src


def _enlargeable(match: re.Match) -> str:
    """A picture on a line of its own, at the column's width and linked to its full size (Sphinx links
    a picture given a width to its original)."""
    alt, path = match.groups()
    return f"```{{image}} {path}\n:alt: {alt}\n:width: 100%\n```"


def execute_notebook(path: Path, figures: Path, timeout: int = 600) -> float:
    """Run ``path`` top to bottom in its own folder, its pictures saved into ``figures``
    (``$TRACEVLLM_FIGURES``), and write it back with its outputs; returns the seconds it took. A
    failing cell raises ``nbclient.exceptions.CellExecutionError``."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute(env={**os.environ, FIGURES_ENV: str(figures)})
    seconds = time.perf_counter() - start
    nbformat.write(notebook, path)
    return seconds


def _extensions() -> list[str]:
    """Jupyter Book's Sphinx extensions less ``sphinx_thebe``: the book runs no code in the browser,
    and sphinx-thebe 0.3.1 writes its inline script (``const THEBE_JS_URL = ...``) twice into every
    page under Sphinx 7, a SyntaxError in every page's console."""
    from jupyter_book.config import get_default_sphinx_config

    return [e for e in get_default_sphinx_config()["extensions"] if e != "sphinx_thebe"]


def write_config(src: Path) -> None:
    """``_config.yml`` and ``_toc.yml``: the landing page (``chapters/README.md``, which GitHub also
    shows for the folder), each chapter followed by its notebook, then the reference docs."""
    notebooks = {p.stem for p in notebook_paths(src)}
    (src / "_config.yml").write_text(
        f'title: "{TITLE}"\n'
        "author: the tracevllm authors\n"
        "only_build_toc_files: false\n"
        "exclude_patterns: [tracevllm, viz]\n"
        "execute:\n"
        "  execute_notebooks: \"off\"\n"
        "sphinx:\n"
        "  config:\n"
        "    html_show_copyright: false\n"
        "    myst_heading_anchors: 3\n"
        f"    extensions: [{', '.join(_extensions())}]\n",
        encoding="utf-8",
    )
    lines = ["format: jb-book", "root: chapters/README", "parts:", "  - caption: Chapters", "    chapters:"]
    for chapter in chapter_paths(src):
        lines.append(f"      - file: chapters/{chapter.stem}")
        if chapter.stem in notebooks:
            lines += ["        sections:", f"          - file: notebooks/{chapter.stem}"]
    lines += ["  - caption: Reference", "    chapters:", "      - file: README"]
    lines += [f"      - file: docs/{p.stem}" for p in sorted((src / "docs").glob("*.md"))]
    (src / "_toc.yml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def build_html(src: Path) -> Path:
    """Run Jupyter Book on a staged (and executed) ``src``; returns the site's ``index.html``."""
    write_config(src)
    subprocess.run([sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
                    "build", str(src), "--path-output", str(src.parent), "--warningiserror", "--quiet"],
                   check=True)
    return src.parent / "_build" / "html" / "index.html"


def build(out: Path) -> Path:
    """Stage, execute every notebook, build; returns the site's ``index.html``."""
    src = stage(out / "src")
    for path in notebook_paths(src):
        print(f"executing {path.name} ...", flush=True)
        print(f"  {execute_notebook(path, src / 'chapters' / 'images'):.1f} s", flush=True)
    return build_html(src)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chapters.book", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out-dir", default=str(REPO / "build" / "book"),
                        help="where to stage, execute and build (default: build/book in the checkout)")
    args = parser.parse_args(argv)
    index = build(Path(args.out_dir).resolve())
    print(f"built {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
