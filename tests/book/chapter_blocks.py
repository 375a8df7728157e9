"""The fenced code blocks of a chapter, each with its language, its first line's number and the
paragraph just before it (which says what the block is: a quote of the files it links, a command)."""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class CodeBlock:
    language: str  # "" when the fence names none
    code: str
    line: int  # of the opening fence, from 1
    paragraph: str  # the text between the blank line before the fence and the fence


def code_blocks(text: str) -> list[CodeBlock]:
    blocks = []
    for m in FENCE.finditer(text):
        before = text[:m.start()]
        blocks.append(CodeBlock(m.group(1), m.group(2), before.count("\n") + 1,
                                before.rstrip("\n").split("\n\n")[-1]))
    return blocks
