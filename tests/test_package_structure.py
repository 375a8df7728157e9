"""The package's shape, checked statically: no import cycles inside ``tracevllm`` (lazy imports
count; ``TYPE_CHECKING`` blocks and the executor factory do not); one direction between the engine and
what reads its traces (engine <- ``tracing/`` <- ``viz/`` <- the commands that run the engine on a
trace); and the plain modules name no speed-up (tracevllm/optimizations.py lists them; each lives in
a module of its own). That the core imports no tracing is tests/core/test_boundary.py's check."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.core.test_boundary import runtime_imports

PACKAGE = Path(__file__).resolve().parents[1] / "tracevllm"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imported_modules(name: str) -> set[str]:
    """The package modules ``name`` imports when it runs, lazy imports included (tests/core/test_boundary.py
    reads the imports: ``TYPE_CHECKING`` blocks excepted)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return {m for m in runtime_imports(path.read_text(), package) if m in MODULES and m != name}


# Executor.get_class picks a subclass by name: the base class names its subclasses, which import it.
FACTORY_EDGES = {("tracevllm.executor.abstract", f"tracevllm.executor.{m}")
                 for m in ("multiproc_executor", "ray_distributed_executor", "uniproc_executor")}


def _import_graph() -> dict[str, set[str]]:
    return {name: {m for m in _imported_modules(name) if (name, m) not in FACTORY_EDGES} for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def test_no_import_cycles():
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


VIZ = PACKAGE.parent / "viz"
# What viz may import of tracevllm: the trace schema and the step-cost model (both import nothing of the engine).
BELOW_VIZ = ("tracevllm.tracing.schema", "tracevllm.step_cost")
# The commands that read a trace or run the engine on one: the only part of tracevllm above viz
# (with the live page's server on a running vLLM, which serves the page as `tracevllm serve` does).
ABOVE_VIZ = ("tracevllm.entrypoints", "tracevllm.benchmarks", "tracevllm.whatif", "tracevllm.parity",
             "tracevllm.vllm.live_server")


def _is_top(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in ABOVE_VIZ)


def _imports_viz(name: str) -> bool:
    return any(m == "viz" or m.startswith("viz.") for m in runtime_imports(MODULES[name].read_text(), name))


def test_viz_imports_only_the_trace_schema_and_the_step_cost_model_of_tracevllm():
    files = sorted(VIZ.rglob("*.py"))
    assert len(files) > 30
    for path in files:
        package = ".".join(path.parent.relative_to(PACKAGE.parent).parts)
        imported = set(runtime_imports(path.read_text(), package))
        bad = sorted(m for m in imported if m.split(".")[0] in ("tracevllm", "chapters")
                     and not m.startswith(BELOW_VIZ) and m not in ("tracevllm", "tracevllm.tracing"))
        assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {bad}"


def test_nothing_below_the_commands_reaches_viz():
    """Directly or through another module: the engine, the tracers and the server's core path load no
    viz module, whatever they import."""
    graph = _import_graph()
    below = sorted(m for m in MODULES if not _is_top(m))
    assert "tracevllm.engine.core" in below and "tracevllm.tracing.engine_tracer" in below
    for name in below:
        reached, todo = set(), [name]
        while todo:
            m = todo.pop()
            if m not in reached:
                reached.add(m)
                todo.extend(graph[m])
        assert not [m for m in sorted(reached) if _imports_viz(m)], f"{name} reaches viz through {sorted(reached)}"


def test_what_viz_imports_of_tracevllm_stays_low():
    """The schema names the engine's stages (core/stages.py, names only); the step-cost model imports nothing."""
    assert _imported_modules("tracevllm.tracing.schema") <= {"tracevllm.core", "tracevllm.core.stages"}
    assert not _imported_modules("tracevllm.core.stages") and not _imported_modules("tracevllm.step_cost")


def test_the_direction_check_sees_the_commands():
    assert _imports_viz("tracevllm.entrypoints.traces_cli") and _imports_viz("tracevllm.whatif.pace")
    assert not _imports_viz("tracevllm.tracing.schema")


PLAIN_MODULES = ["tracevllm.attention.backends.torch_attn", "tracevllm.layers.linear",
                 *sorted(m for m in MODULES if m.startswith("tracevllm.models.") and m != "tracevllm.models.loader")]


def _speed_up_names() -> set[str]:
    """Every switch's name, and the name of what implements it: the function of that name, or the
    class whose name is its CamelCase (optimizations.py's rule)."""
    from tracevllm.optimizations import OPTIMIZATIONS

    names = set(OPTIMIZATIONS)
    names |= {"".join(word.capitalize() for word in name.split("_")) for name in OPTIMIZATIONS}
    return names


SPEED_UP_MODULES = ("tracevllm.attention.backends.cpu_attn", "tracevllm.attention.ops", "tracevllm.layers.cpu_gemm",
                    "tracevllm.layers.rope_cache", "tracevllm.layers.compiled", "tracevllm.layers.cpu_norm_act",
                    "tracevllm.optimizations")


@pytest.mark.parametrize("name", PLAIN_MODULES)
def test_a_plain_module_names_no_speed_up(name):
    tree = ast.parse(MODULES[name].read_text())
    identifiers = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    identifiers |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    identifiers |= {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names}
    assert not identifiers & _speed_up_names()
    assert not {m for m in _imported_modules(name) if m.startswith(SPEED_UP_MODULES)}


def test_the_plain_modules_are_found():
    assert "tracevllm.models.llama" in PLAIN_MODULES and len(PLAIN_MODULES) >= 5
    assert {"OnednnGemm", "DecodePlan", "RopeCache", "CompiledNormAct"} <= _speed_up_names()
