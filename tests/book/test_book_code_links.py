"""A chapter's link that names a definition (``[`Scheduler.schedule`](../tracevllm/....py)``) opens
the book's page of that file at the definition's line, not at line 1 (chapters/code_links.py)."""

from __future__ import annotations

import re

import pytest

from chapters.code_links import definition_line, link_code, target

SOURCE = '''"""A module."""
LIMIT = 3


class Pool:
    size: int = 0

    @property
    def free(self):
        return 1

    def take(self):
        return 2
'''


@pytest.mark.parametrize("name, line", [("LIMIT", 2), ("Pool", 5), ("Pool.size", 6), ("Pool.free", 8),
                                        ("Pool.take", 12), ("Pool.missing", None), ("take", None)])
def test_definition_line(name, line):
    assert definition_line(SOURCE, name) == line


def test_links_point_at_their_definition_or_the_whole_file(tmp_path):
    (tmp_path / "tracevllm").mkdir()
    (tmp_path / "tracevllm" / "pool.py").write_text(SOURCE)
    text, linked = link_code("[`Pool.take`](../tracevllm/pool.py), [the pool](../tracevllm/pool.py), "
                             "[`pool.py`](../tracevllm/pool.py)", tmp_path)
    assert text == ("[`Pool.take`](#code-tracevllm-pool-py-pool-take), [the pool](../code/tracevllm/pool.py.md), "
                    "[`pool.py`](../code/tracevllm/pool.py.md)")
    assert linked == {"tracevllm/pool.py": {"Pool.take"}}


def test_code_pages_have_a_target_at_each_linked_definition(book_src):
    """Every definition a chapter links has a target on its file's page, right before a block of the
    file that starts at the definition's line (numbered as in the file)."""
    checked = 0
    for chapter in sorted((book_src / "chapters").glob("*.md")):
        for label in re.findall(r"\]\(#(code-[a-z0-9-]+)\)", chapter.read_text(encoding="utf-8")):
            checked += 1
            page = next(p for p in (book_src / "code").rglob("*.md") if f"({label})=" in p.read_text())
            code_path = page.relative_to(book_src / "code").as_posix()[:-3]
            block = page.read_text().split(f"({label})=\n", 1)[1]
            first = int(re.search(r":lines: (\d+)-", block).group(1))
            line = (book_src / code_path).read_text().splitlines()[first - 1].strip()
            assert re.match(r"(@|def |async def |class |[A-Za-z_]\w*\s*[:=])", line), (label, line)
    assert checked > 150  # the chapters name their definitions (205 such links when this was written)
    assert target("tracevllm/core/sched/scheduler.py", "Scheduler.schedule") in (
        book_src / "chapters" / "04-scheduler.md").read_text()
