"""Every command a chapter shows parses as written against the command line's own parser.

The commands checked are those of the chapters' shell blocks (```bash, sh, console, shell):
``tracevllm ...`` (or a path ending in ``/tracevllm``), ``python -m tracevllm.entrypoints.cli ...``,
and ``python -m viz ...`` (``tracevllm viz``'s flags). A line is split as the shell splits it
(``shlex``: quotes, ``#`` comments, ``\\`` continuations, a console's ``$`` prompt dropped), and at
``&&``, ``||``, ``;`` and ``|``. Nothing is run: argparse only parses, so a mistyped flag, a missing
argument or a bad choice is caught without a model.
"""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import pytest

from tests.book.chapter_blocks import code_blocks
from tracevllm.entrypoints.cli import make_parser
from chapters.book import REPO

CHAPTERS = sorted((REPO / "chapters").glob("*.md"))
SHELL = {"bash", "sh", "console", "shell"}
SEPARATORS = {"&&", "||", ";", "|"}
# How a command line starts -> the argv it gives `tracevllm`.
PROGRAMS = {("python", "-m", "tracevllm.entrypoints.cli"): [], ("python", "-m", "viz"): ["viz"]}


def _as_tracevllm(words: list[str]) -> list[str] | None:
    """The ``tracevllm`` argv of a command, or None when it runs another program."""
    if words and (words[0] == "tracevllm" or words[0].endswith("/tracevllm")):
        return words[1:]
    for start, argv in PROGRAMS.items():
        if len(words) >= 3 and (words[0].split("/")[-1].startswith("python"), *words[1:3]) == (True, *start[1:]):
            return argv + words[3:]
    return None


def _lines(code: str, first: int) -> list[tuple[int, str]]:
    """The block's command lines (a ``\\`` continuation joined to the next line), each with the
    number of the line it starts on, without a console's ``$`` prompt."""
    lines: list[tuple[int, str]] = []
    start, joined = None, ""
    for number, line in enumerate(code.splitlines(), start=first):
        start = number if start is None else start
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        lines.append((start, (joined + line).strip().removeprefix("$ ")))
        start, joined = None, ""
    return lines


def chapter_commands(chapter: Path) -> list[tuple[int, list[str]]]:
    """Each ``tracevllm`` command of the chapter's shell blocks: (its line, its argv)."""
    commands = []
    for block in code_blocks(chapter.read_text(encoding="utf-8")):
        if block.language not in SHELL:
            continue
        for number, line in _lines(block.code, block.line + 1):
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            for token in [*lexer, ";"]:
                if token in SEPARATORS:
                    if (argv := _as_tracevllm(words)) is not None:
                        commands.append((number, argv))
                    words = []
                else:
                    words.append(token)
    return commands


def parse_error(argv: list[str]) -> str | None:
    """argparse's message for ``tracevllm argv``, or None when it parses."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            make_parser(argv).parse_args(argv)
    except SystemExit as e:
        return stderr.getvalue().strip().splitlines()[-1] if e.code else None
    return None


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_commands_parse(chapter):
    errors = [f"{chapter.name}:{line}: tracevllm {shlex.join(argv)}\n  {error}"
              for line, argv in chapter_commands(chapter) if (error := parse_error(argv))]
    assert not errors, "\n".join(errors)


def test_the_chapters_show_commands():
    """The blocks are found: a change of how chapters write them would otherwise pass unchecked."""
    assert sum(len(chapter_commands(c)) for c in CHAPTERS) >= 15  # 17 when this was written


def test_a_bad_flag_is_caught(tmp_path):
    chapter = tmp_path / "13-whatif.md"
    chapter.write_text((REPO / "chapters" / "13-whatif.md").read_text().replace(
        "tracevllm traces fit traces/run", "tracevllm traces fit traces/run --held-out-share 0.2"))
    errors = [parse_error(argv) for _, argv in chapter_commands(chapter)]
    assert [e for e in errors if e] == ["tracevllm traces fit: error: unrecognized arguments: --held-out-share 0.2"]


def test_the_shell_is_split_as_the_shell_splits_it(tmp_path):
    chapter = tmp_path / "x.md"
    chapter.write_text("```console\n$ tracevllm traces check 'a dir' && cd x; .venv/bin/tracevllm traces fit \\\n"
                       "  b # a comment\npython3 -m viz c -o d | head\nls -l\n```\n")
    assert chapter_commands(chapter) == [(2, ["traces", "check", "a dir"]), (2, ["traces", "fit", "b"]),
                                         (4, ["viz", "c", "-o", "d"])]
