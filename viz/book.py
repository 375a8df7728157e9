"""``python -m viz.book [-o build/book]``: the learner's book, built into a static HTML site.

The book is ``chapters/`` (one Markdown chapter per stage of a request's path) and ``notebooks/`` (one
notebook per chapter), built with Jupyter Book in three steps:

1. **Stage** a copy of what the book shows under ``OUT/src``: the chapters and their pictures, the
   notebooks and the reference docs. A chapter's link to a source file (``../tracevllm/....py``,
   which works on GitHub) is pointed at a page of the book that shows that file, numbered and
   highlighted.
2. **Execute** every notebook there with nbclient, in its own folder. Each notebook runs the real
   engine, replays its trace and redraws its chapter's pictures into the staged ``chapters/images``,
   so the book shows this run's pictures and outputs, and a notebook whose assertions fail stops the
   build.
3. **Build** the HTML (``jupyter-book build``, notebooks not executed again) into ``OUT/_build/html``.

The tests (``tests/book/``) use the same steps: they execute the notebooks one by one and then build
the book from them.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TITLE = "tracevllm: one request, every stage"
# Copied beside the chapters so that their links resolve inside the book.
_CODE_DIRS = ("tracevllm", "viz")
_REFERENCE_DOCS = ("README.md", "docs")
# A Markdown link to one of our source files, as chapters write it: ](../tracevllm/core/request.py)
_CODE_LINK = re.compile(r"\]\(\.\./((?:tracevllm|viz)/[\w/.-]+\.py)\)")


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
    shutil.copytree(repo / "chapters", src / "chapters")
    shutil.copytree(repo / "notebooks", src / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for name in _REFERENCE_DOCS:
        path = repo / name
        if path.is_dir():
            shutil.copytree(path, src / name)
        else:
            shutil.copy2(path, src / name)
    for name in _CODE_DIRS:
        shutil.copytree(repo / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for chapter in chapter_paths(src):
        text = chapter.read_text(encoding="utf-8")
        for code_path in set(_CODE_LINK.findall(text)):
            _write_code_page(src, code_path)
        chapter.write_text(_CODE_LINK.sub(r"](../code/\1.md)", text), encoding="utf-8")
    return src


def _write_code_page(src: Path, code_path: str) -> None:
    """``code/<path>.md``: the source file, numbered and highlighted (a page outside the table of
    contents, reached from the chapters' code links)."""
    page = src / "code" / f"{code_path}.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        f"---\norphan: true\n---\n\n# {code_path}\n\n"
        f"```{{literalinclude}} /{code_path}\n:language: python\n:linenos:\n```\n",
        encoding="utf-8",
    )


def execute_notebook(path: Path, timeout: int = 600) -> float:
    """Run ``path`` top to bottom in its own folder and write it back with its outputs; returns the
    seconds it took. A failing cell raises ``nbclient.exceptions.CellExecutionError``."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nbformat.write(notebook, path)
    return seconds


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def write_config(src: Path) -> None:
    """``_config.yml``, ``_toc.yml`` and the front page: each chapter followed by its notebook, then
    the reference docs."""
    chapters = chapter_paths(src)
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
        "    myst_heading_anchors: 3\n",
        encoding="utf-8",
    )
    lines = ["format: jb-book", "root: index", "parts:", "  - caption: Chapters", "    chapters:"]
    for chapter in chapters:
        lines.append(f"      - file: chapters/{chapter.stem}")
        if chapter.stem in notebooks:
            lines += ["        sections:", f"          - file: notebooks/{chapter.stem}"]
    lines += ["  - caption: Reference", "    chapters:", "      - file: README"]
    lines += [f"      - file: docs/{p.stem}" for p in sorted((src / "docs").glob("*.md"))]
    (src / "_toc.yml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    contents = "\n".join(f"{i}. [{_title(c)}](chapters/{c.name})" for i, c in enumerate(chapters))
    (src / "index.md").write_text(
        f"# {TITLE}\n\n"
        "vLLM V1's inference engine, rebuilt in Python, followed one request at a time. Each chapter "
        "explains one stage of a request's path and links to the code that does it; its notebook runs "
        "the real engine on your machine, replays the trace, and checks that what the chapter claims "
        "is what happened. Start with [chapter 0](chapters/00-the-map.md).\n\n" + contents + "\n",
        encoding="utf-8",
    )


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
        print(f"  {execute_notebook(path):.1f} s", flush=True)
    return build_html(src)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m viz.book", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out-dir", default=str(REPO / "build" / "book"),
                        help="where to stage, execute and build (default: build/book in the checkout)")
    args = parser.parse_args(argv)
    index = build(Path(args.out_dir).resolve())
    print(f"built {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
