"""The engine core does not depend on tracing: no module under tracevllm/core/ imports tracevllm.tracing.

The core records typed events and owns the names of its stages (core/events.py, core/stages.py); the
tracing schema and tracers import them, never the reverse. A lazy import (inside a function) counts;
one under ``if TYPE_CHECKING:`` does not, since it never runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "tracevllm"
FORBIDDEN = "tracevllm.tracing"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(source: str, package: str) -> Iterator[str]:
    """Every module that ``source``, a module of ``package``, imports when it runs, at any depth:
    ``import a.b``, ``from a import b`` (as ``a`` and ``a.b``), relative imports resolved, and
    ``importlib.import_module("a.b")``; not the bodies of ``if TYPE_CHECKING:``."""
    tree = ast.parse(source)
    type_checking_only = {id(node) for block in ast.walk(tree)
                          if isinstance(block, ast.If) and _is_type_checking(block.test)
                          for statement in block.body for node in ast.walk(statement)}
    parts = package.split(".")
    for node in ast.walk(tree):
        if id(node) in type_checking_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            yield name
            yield from (f"{name}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.args[0].value


def _package(path: Path) -> str:
    return ".".join(path.parent.relative_to(PACKAGE.parent).parts)


def test_the_core_imports_no_tracing():
    files = sorted((PACKAGE / "core").rglob("*.py"))
    assert len(files) >= 12
    for path in files:
        bad = sorted({m for m in runtime_imports(path.read_text(), _package(path))
                      if m == FORBIDDEN or m.startswith(FORBIDDEN + ".")})
        assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {bad}: the core must not depend on tracing"


def test_the_check_sees_lazy_and_relative_imports_but_not_type_checking_ones():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from tracevllm.tracing.schema import SpanName\n"
        "def f():\n"
        "    from ..tracing import schema\n"
        "    import importlib\n"
        "    return importlib.import_module('tracevllm.tracing.otel')\n"
    )
    found = set(runtime_imports(source, "tracevllm.core"))
    assert {"tracevllm.tracing", "tracevllm.tracing.schema", "tracevllm.tracing.otel"} <= found
    assert "tracevllm.tracing.schema.SpanName" not in found
