"""The engine decides, observers watch: the engine core never touches OpenTelemetry.

The scheduler, the KV cache, the workers, the sampler and the engine core record typed events
(core/events.py); only tracevllm/tracing/ turns them into spans. These tests fail if an OpenTelemetry
import, or a tracer or span, creeps back into that code.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1] / "tracevllm"
ENGINE_CORE_FILES = sorted([*(ROOT / "core").rglob("*.py"), *(ROOT / "worker").rglob("*.py"),
                            *(ROOT / "sample").rglob("*.py"), ROOT / "engine" / "core.py",
                            ROOT / "engine" / "core_proc.py"])
# Where no tracer or span may be a parameter or an attribute, whatever the tracing is.
NO_SPANS_FILES = ENGINE_CORE_FILES + [ROOT / "request.py", ROOT / "engine" / "processor.py",
                                      ROOT / "engine" / "output_processor.py"]
OTEL_MODULES = ("opentelemetry", "tracevllm.tracing.otel", "tracevllm.tracing.engine_tracer",
                "tracevllm.tracing.worker_tracer", "tracevllm.tracing.request_tracer", "tracevllm.tracing.http")


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_engine_core_code_imports_no_opentelemetry():
    assert len(ENGINE_CORE_FILES) > 15
    for path in ENGINE_CORE_FILES:
        modules = imported_modules(ast.parse(path.read_text()))
        bad = sorted(m for m in modules if m.startswith(OTEL_MODULES))
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {bad}"


def test_importing_the_engine_core_loads_no_opentelemetry():
    code = ("import sys\n"
            "import tracevllm.engine.core_proc, tracevllm.core.sched.scheduler, tracevllm.worker.gpu_model_runner\n"
            "import tracevllm.sample.sampler, tracevllm.engine.llm_engine, tracevllm.entrypoints.llm\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=ROOT.parent)
    assert result.stdout.strip() == "[]"


def test_no_tracer_or_span_in_the_engine():
    for path in NO_SPANS_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg):
                name = node.arg
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name = node.target.id  # a dataclass field
            else:
                continue
            assert name not in ("tracer", "span", "parent_span"), f"{path.relative_to(ROOT.parent)}: {name}"
