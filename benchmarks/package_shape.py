"""The package's shape in four numbers, for a checkout: how the engine and what reads its traces import
each other, how long the learner's core path is, how many step-cost models there are, and which file
names mean two things.

    python benchmarks/package_shape.py [CHECKOUT]      (default: this one)

To hold two commits side by side: ``git worktree add --detach /tmp/old OLD_COMMIT``, then run it on both.

- **Import edges**: import lines (at any depth, lazy ones included) from ``tracevllm/`` into ``viz/``,
  and from ``viz/`` into ``tracevllm/``, as ``grep -rEn "^\\s*(from|import) viz\\b" tracevllm`` counts them.
- **The learner's core path**: the modules that ``import tracevllm.entrypoints.llm`` loads (module-level
  imports, followed), less the model itself (``models/``, ``layers/``, ``attention/``, ``distributed/``),
  the tracers (``tracing/``) and the speed-up switches (``optimizations.py``): what ``LLM.generate`` runs
  from the prompt to the ``RequestOutput``. Files and lines.
- **Step-cost models**: the classes that model what a step costs (``StepCost``, ``CostModel``,
  ``StepCostModel``: a name with ``StepCost`` or ``CostModel`` in it).
- **Twin names**: file names that two modules of ``tracevllm/``, ``viz/``, ``chapters/`` or
  ``benchmarks/`` share (``__init__.py`` and the ``utils.py``, ``config.py``, ``abstract.py`` vLLM has
  many of aside).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

NOT_THE_PATH = ("tracevllm.models", "tracevllm.layers", "tracevllm.attention", "tracevllm.distributed",
                "tracevllm.tracing", "tracevllm.optimizations")
VLLM_SHARED_NAMES = {"__init__.py", "__main__.py", "utils.py", "config.py", "abstract.py"}


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in (root / "tracevllm").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _module_level_imports(name: str, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` loads when imported: its module-level imports (``TYPE_CHECKING``
    blocks aside) and their parent packages."""
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for statement in ast.parse(path.read_text()).body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.dump(statement.test):
            continue
        for node in ast.walk(statement) if isinstance(statement, (ast.If, ast.Try)) else [statement]:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    loaded = set()
    for module in found:
        parts = module.split(".")
        loaded |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules}
    return loaded


def core_path(root: Path) -> dict[str, int]:
    """Module -> its lines, for the learner's core path."""
    modules, seen, todo = _modules(root), set(), ["tracevllm.entrypoints.llm"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_module_level_imports(name, modules) - seen)
    return {name: len(modules[name].read_text().splitlines()) for name in sorted(seen)
            if not name.startswith(NOT_THE_PATH) and modules[name].read_text().strip()}


def import_lines(directory: Path, target: str) -> dict[str, list[str]]:
    """Each import line in ``directory`` that names ``target``, by the subpackage it is in, with the
    module it imports."""
    pattern = re.compile(rf"^\s*(?:from|import) ({target}[\w.]*)")
    found = defaultdict(list)
    for path in sorted(directory.rglob("*.py")):
        parts = path.relative_to(directory).parts
        for line in path.read_text().splitlines():
            if match := pattern.match(line):
                found[parts[0] if len(parts) > 1 else path.name].append(match.group(1))
    return found


def _edges(found: dict[str, list[str]]) -> str:
    total = sum(len(v) for v in found.values())
    where = ", ".join(f"{len(v)} from {k}" for k, v in sorted(found.items(), key=lambda kv: -len(kv[1])))
    return f"{total} ({where}; importing {', '.join(sorted({m for v in found.values() for m in v}))})"


def cost_models(root: Path) -> list[str]:
    pattern = re.compile(r"^class (\w*(?:StepCost|CostModel)\w*)", re.M)
    return sorted(f"{path.relative_to(root)}: {name}" for directory in ("tracevllm", "viz")
                  for path in (root / directory).rglob("*.py") for name in pattern.findall(path.read_text()))


def twin_names(root: Path) -> dict[str, list[str]]:
    by_name = defaultdict(list)
    for directory in ("tracevllm", "viz", "chapters", "benchmarks"):
        for path in sorted((root / directory).rglob("*.py")):
            by_name[path.name].append(str(path.relative_to(root)))
    return {name: paths for name, paths in sorted(by_name.items()) if len(paths) > 1 and name not in VLLM_SHARED_NAMES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", nargs="?", default=str(Path(__file__).resolve().parents[1]),
                        help="a checkout of tracevllm (default: this one)")
    root = Path(parser.parse_args().checkout).resolve()
    path = core_path(root)
    print(f"{root}")
    print(f"  import lines tracevllm/ -> viz/: {_edges(import_lines(root / 'tracevllm', 'viz'))}")
    print(f"  import lines viz/ -> tracevllm/: {_edges(import_lines(root / 'viz', 'tracevllm'))}")
    print(f"  the learner's core path: {len(path)} files, {sum(path.values())} lines")
    models = cost_models(root)
    print(f"  step-cost model classes: {len(models)} ({'; '.join(models)})")
    twins = twin_names(root)
    print(f"  twin file names: {len(twins)}" + "".join(f"\n    {name}: {', '.join(paths)}" for name, paths in twins.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
