"""The book's pages of source code: a chapter's link to one of our files opens that file, numbered and
highlighted, at the line of the definition the link names.

A link names a definition when its text is a backticked dotted name, as the chapters write them
(``[`Scheduler.schedule`](../tracevllm/core/sched/scheduler.py)``; tests/book/test_book_chapters.py
checks that the name is defined there). Its code page is cut into blocks at those definitions, each
block numbered by the file's own lines and preceded by a target, and the link points at the target::

    ](../tracevllm/core/sched/scheduler.py)   ->  ](#code-tracevllm-core-sched-scheduler-py-scheduler-schedule)
    code/tracevllm/core/sched/scheduler.py.md:    lines 1-40 | (target)= lines 41-... | ...

A link whose text names no definition (the file's path) opens the page at line 1.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

# A Markdown link to one of our source files, as chapters write it: [text](../tracevllm/core/request.py)
CODE_LINK = re.compile(r"\[([^\]]*)\]\(\.\./((?:tracevllm|viz)/[\w/.-]+\.py)\)")
_NAME = re.compile(r"`([A-Za-z_]\w*(?:\.\w+)*)`")


def definition_line(source: str, dotted: str) -> int | None:
    """The line (1-based; a decorated definition's first decorator) where ``dotted`` (``Class.method``,
    ``function``, ``CONSTANT``, ``Class.attribute``) is defined in ``source``: a def or class, an
    assignment at module or class level, or else a ``self.<name> =`` inside the class; None if nowhere."""
    module = ast.parse(source)
    scope: list[ast.stmt] = module.body
    line = None
    for part in dotted.split("."):
        found = None
        for node in scope:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == part:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = node
        if found is None and scope is not module.body:
            found = next((node for node in ast.walk(ast.Module(body=scope, type_ignores=[]))
                          if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                          and isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr == part),
                         None)
        if found is None:
            return None
        decorators = getattr(found, "decorator_list", [])
        line = min([found.lineno, *(d.lineno for d in decorators)])
        scope = found.body if isinstance(found, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else []
    return line


def target(code_path: str, name: str) -> str:
    """The target of ``name``'s line on ``code_path``'s page (Sphinx's own normalisation of a label)."""
    return re.sub(r"[^a-z0-9]+", "-", f"code {code_path} {name}".lower()).strip("-")


def link_code(text: str, src: Path) -> tuple[str, dict[str, set[str]]]:
    """``text`` (a Markdown page of the staged book under ``src``) with its code links pointed at the
    code pages, and the definitions each linked file must have a target for."""
    linked: dict[str, set[str]] = {}

    def point(match: re.Match) -> str:
        label, code_path = match.groups()
        names = linked.setdefault(code_path, set())
        name = _NAME.fullmatch(label)
        if name and not name.group(1).endswith(".py"):
            source = (src / code_path).read_text(encoding="utf-8")
            if definition_line(source, name.group(1)) is not None:
                names.add(name.group(1))
                return f"[{label}](#{target(code_path, name.group(1))})"
        return f"[{label}](../code/{code_path}.md)"

    return CODE_LINK.sub(point, text), linked


def write_code_page(src: Path, code_path: str, names: set[str]) -> None:
    """``code/<path>.md``: the source file, numbered and highlighted, cut into blocks at the lines
    of ``names`` (a page outside the table of contents, reached from the code links)."""
    source = (src / code_path).read_text(encoding="utf-8")
    starts: dict[int, list[str]] = {}
    for name in sorted(names):
        starts.setdefault(definition_line(source, name), []).append(name)
    edges = sorted({1, *starts}) + [len(source.splitlines()) + 1]
    blocks = []
    for first, end in zip(edges, edges[1:]):
        if end <= first:
            continue
        labels = "".join(f"({target(code_path, n)})=\n" for n in starts.get(first, []))
        blocks.append(f"{labels}```{{literalinclude}} /{code_path}\n:language: python\n:lines: {first}-{end - 1}\n"
                      ":lineno-match:\n```\n")
    page = src / "code" / f"{code_path}.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"---\norphan: true\n---\n\n# {code_path}\n\n" + "\n".join(blocks), encoding="utf-8")
