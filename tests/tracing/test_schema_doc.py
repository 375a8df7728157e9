"""docs/tracing.md's span table is the schema module's, and the tracers write only schema names."""

from __future__ import annotations

import re
from pathlib import Path

from tracevllm.tracing import schema, schema_doc

ROOT = Path(__file__).parents[2]


def test_the_doc_table_is_generated_from_the_schema():
    doc = (ROOT / "docs" / "tracing.md").read_text()
    table = re.search(r"<!-- schema table:.*?-->\n(.*?)<!-- end of schema table -->", doc, re.S)
    assert table, "docs/tracing.md lost its schema table markers"
    assert table.group(1) == schema_doc.markdown_table(), "regenerate it: python -m tracevllm.tracing.schema_doc"


def test_every_span_name_is_in_the_table():
    names = {v for k, v in vars(schema.SpanName).items() if not k.startswith("_")}
    table = schema_doc.markdown_table()
    assert all(f"`{name}`" in table for name in names)


def test_tracers_use_no_literal_names():
    """Span, event and attribute names reach the tracers and viz only through the schema module (the
    names that cannot be mistaken for a plain word: dotted, with an underscore, a capital or a space)."""
    names = {v for cls in (schema.SpanName, schema.EventName, schema.Attr, schema.GenAI, schema.VllmAttr)
             for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, str)
             and re.search(r"[._ A-Z]", v)}
    files = [*(ROOT / "tracevllm" / "tracing").glob("*_tracer.py"), ROOT / "tracevllm" / "tracing" / "http.py",
             *(ROOT / "viz").rglob("*.py")]
    for path in files:
        literals = set(re.findall(r'"([^"\\n]+)"', path.read_text()))
        assert not literals & names, f"{path.name} spells {sorted(literals & names)} instead of using the schema"
