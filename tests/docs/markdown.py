"""Just enough Markdown to read the README's tables and code: no renderer, no rigid format.

A table is a run of lines that start with ``|``; its first row is the header and its
second the separator. Cells split on ``|`` not escaped as ``\\|`` (an escaped one is
read as ``|``). Code is what sits between backticks (a span may run over a line break)
or in a fenced block.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

README = REPO / "README.md"

_FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`]+)`")
_CELL_BORDER = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class Table:
    """A Markdown table: its header cells and its rows (cells, stripped and unescaped)."""

    line: int  # 1-based line of the header in the file
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    @property
    def key(self) -> str:
        """The first header cell, lowercased: how a test finds its table."""
        return self.header[0].lower()


def readme_text(path: Path = README) -> str:
    return path.read_text(encoding="utf-8")


def _cells(line: str) -> tuple[str, ...]:
    inner = line.strip()
    inner = inner.removeprefix("|").removesuffix("|")
    return tuple(c.strip().replace("\\|", "|") for c in _CELL_BORDER.split(inner))


def tables(text: str) -> list[Table]:
    found: list[Table] = []
    block: list[tuple[int, str]] = []
    for number, line in enumerate([*text.splitlines(), ""], start=1):
        if line.lstrip().startswith("|"):
            block.append((number, line))
            continue
        if len(block) >= 2 and set(block[1][1].replace("|", "").strip()) <= set("-: "):
            found.append(
                Table(
                    line=block[0][0],
                    header=_cells(block[0][1]),
                    rows=tuple(_cells(row) for _, row in block[2:]),
                )
            )
        block = []
    return found


def table_headed(text: str, first_cell: str) -> Table:
    """The one table whose first header cell is ``first_cell`` (any case)."""
    found = [t for t in tables(text) if t.key == first_cell.lower()]
    assert len(found) == 1, (
        f"the README needs one table whose first column is headed {first_cell!r}; "
        f"found {len(found)}"
    )
    return found[0]


def code_spans(text: str) -> list[str]:
    """Inline code (fenced blocks left out), a line break inside a span read as a space;
    a span never runs past its paragraph, nor past its line in a table."""
    prose = _FENCE.sub("", text)
    spans: list[str] = []
    for block in re.split(r"\n[ \t]*\n", prose):
        lines = block.splitlines()
        pieces = lines if any(line.lstrip().startswith("|") for line in lines) else [block]
        for piece in pieces:
            spans += [" ".join(span.split()) for span in _SPAN.findall(piece)]
    return spans


def fenced_lines(text: str) -> Iterator[str]:
    """Each line of every fenced code block."""
    for block in _FENCE.findall(text):
        yield from block.splitlines()


def split_top(text: str, separator: str, maxsplit: int = -1) -> list[str]:
    """``text`` split on ``separator`` outside parentheses, brackets and code spans."""
    parts: list[str] = []
    depth, in_code, start, i = 0, False, 0, 0
    while i < len(text):
        c = text[i]
        if c == "`":
            in_code = not in_code
        elif not in_code and c in "([{":
            depth += 1
        elif not in_code and c in ")]}":
            depth = max(0, depth - 1)
        elif (
            not in_code
            and depth == 0
            and text.startswith(separator, i)
            and (maxsplit < 0 or len(parts) < maxsplit)
        ):
            parts.append(text[start:i])
            i += len(separator)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts]
