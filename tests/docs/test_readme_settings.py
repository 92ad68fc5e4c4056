"""The README's settings table says what ``sidecar/config.py`` does.

Every setting of :class:`~sidecar.config.Settings` is named, by its environment
variable, in the first cell of a row of the README's table headed ``variable``;
every ``GUARDRAIL_…`` variable the README names anywhere is a setting (or a section,
which takes JSON); and where a row states a default, it is the code's.

A row names one or more variables in its first cell, separated by `` / ``; a later
one may leave out its section (``GUARDRAIL_JOIN__MAX_ENTRIES`` / ``__TTL_MS``). The
second cell starts with their defaults in the same order, separated by `` / `` (one
default for several variables is theirs all). A default is a code span (`` `rag.dlq` ``),
a number, ``true``, ``false`` or ``unset``; anything else (``for SASL``, a dash) states
none, and the rest of each part is free text. A range right after a default
(``4, in [0, 64]``, ``67108864 (64 MiB), in [1 MiB, 16 GiB]``, ``500000, at least 1000``)
is the field's bounds. A setting whose values are a fixed list (a ``Literal``) has each
of them in a code span somewhere in its row.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sidecar.config import Settings
from tests.docs.markdown import code_spans, readme_text, split_top, table_headed

PREFIX = "GUARDRAIL_"
_FULL = re.compile(r"(?<![A-Za-z0-9_])GUARDRAIL_[A-Z0-9_]*[A-Z0-9]")
_SHORT = re.compile(r"^__[A-Z0-9_]*[A-Z0-9]$")
_VALUE = re.compile(r"^(true|false|unset|-?\d+(?:\.\d+)?)(?![\w.])")

# names the README shows on purpose although no such setting exists
NOT_SETTINGS = {
    "GUARDRAIL_JOIN__TTL": "the example of a misspelt setting and its error message",
}


def code_settings() -> dict[str, FieldInfo]:
    """Every setting by its environment variable."""
    found: dict[str, FieldInfo] = {}
    for name, field in Settings.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            for inner, info in section.model_fields.items():
                found[f"{PREFIX}{name.upper()}__{inner.upper()}"] = info
        else:
            found[f"{PREFIX}{name.upper()}"] = field
    return found


def sections() -> set[str]:
    """The variables of the sections (``GUARDRAIL_KAFKA``: a JSON object)."""
    return {name.rsplit("__", 1)[0] for name in code_settings() if "__" in name}


@dataclass(frozen=True)
class Row:
    names: tuple[str, ...]  # the variables of its first cell, in order, spelled out
    mentioned: frozenset[str]  # every variable the row names, spelled out
    defaults: str  # the second cell
    text: str  # the whole row

    def __str__(self) -> str:
        return " / ".join(self.names)


def _spelled_out(tokens: list[str]) -> list[str]:
    """``__TTL_MS`` after ``GUARDRAIL_JOIN__MAX_ENTRIES`` is ``GUARDRAIL_JOIN__TTL_MS``."""
    names: list[str] = []
    section: str | None = None
    for token in tokens:
        if _FULL.fullmatch(token):
            names.append(token)
            section = token.rsplit("__", 1)[0] if "__" in token else None
        elif _SHORT.match(token) and section is not None:
            names.append(section + token)
    return names


def readme_rows() -> list[Row]:
    table = table_headed(readme_text(), "variable")
    rows = []
    for cells in table.rows:
        first = _spelled_out(code_spans(cells[0]))
        if not first:
            continue  # OTEL_* and the like
        text = " | ".join(cells)
        # past the first cell, ``__X`` is a setting of the row's own section
        section = [first[0]]
        spans = code_spans(" | ".join(cells[1:]))
        mentioned = {n for s in spans for n in _spelled_out([*section, s]) if n != first[0]}
        rows.append(Row(tuple(first), frozenset(mentioned) | set(first), cells[1], text))
    return rows


def stated_parts(row: Row) -> dict[str, str]:
    """The part of the row's second cell about each variable (its default, then words)."""
    parts = split_top(row.defaults, " / ", maxsplit=len(row.names) - 1)
    if len(parts) == 1:
        parts = parts * len(row.names)
    assert len(parts) == len(row.names), (
        f"README settings row {row}: {len(row.names)} variables but {len(parts)} defaults "
        f"in {row.defaults!r}: give one default each, separated by ' / ', or one for all"
    )
    return dict(zip(row.names, parts, strict=True))


def stated_defaults(row: Row) -> dict[str, str | None]:
    """What the row gives as each variable's default, as written (None: states none)."""
    return {name: _value(part) for name, part in stated_parts(row).items()}


def _value(part: str) -> str | None:
    if part.startswith("`"):
        return part[1:].split("`", 1)[0]
    m = _VALUE.match(part)
    return m.group(1) if m else None


def agrees(written: str, default: Any) -> bool:
    if default is None:
        return written == "unset"
    if isinstance(default, bool):
        return written == str(default).lower()
    if isinstance(default, int | float):
        try:
            return float(written) == float(default)
        except ValueError:
            return False
    return written == str(default)


def test_every_setting_has_a_row() -> None:
    named = {name for row in readme_rows() for name in row.names}
    missing = sorted(set(code_settings()) - named)
    assert missing == [], f"settings missing from the README's settings table: {missing}"


def test_every_variable_the_readme_names_is_a_setting() -> None:
    known = set(code_settings()) | sections() | set(NOT_SETTINGS)
    named = set(_FULL.findall(readme_text()))
    named |= {name for row in readme_rows() for name in row.mentioned}
    unknown = sorted(named - known)
    assert unknown == [], f"the README names variables that are no setting: {unknown}"
    assert set(NOT_SETTINGS) - set(code_settings()) == set(NOT_SETTINGS)


def test_every_stated_default_is_the_code_default() -> None:
    settings = code_settings()
    wrong = []
    for row in readme_rows():
        for name, written in stated_defaults(row).items():
            if written is None or name not in settings:
                continue
            default = settings[name].get_default(call_default_factory=True)
            if not agrees(written, default):
                wrong.append(f"{name}: README {written!r}, code {default!r}")
    assert wrong == [], "README defaults that are not the code's:\n" + "\n".join(wrong)


def test_a_default_written_as_a_number_is_read_as_one() -> None:
    """A part that starts with a number states a default: one the reader cannot take
    (``30s`` for a setting in ms, ``1e6``, ``500ms``) was read as stating none, and went
    unchecked, the unit of a wrong default included."""
    unread = [
        f"{name}: {part!r}"
        for row in readme_rows()
        for name, part in stated_parts(row).items()
        if re.match(r"-?\d", part) and _value(part) is None
    ]
    assert unread == [], "README defaults written as no default can be read:\n" + "\n".join(unread)


def test_every_allowed_value_of_a_fixed_list_is_in_its_row() -> None:
    settings = code_settings()
    missing = []
    for row in readme_rows():
        spans = set(code_spans(row.text))
        for name in row.names:
            allowed = [v for v in _literal_values(settings[name].annotation) if v is not None]
            left_out = [v for v in allowed if str(v) not in spans]
            if left_out:
                missing.append(f"{name}: {left_out}")
    assert missing == [], "allowed values the README's rows leave out:\n" + "\n".join(missing)


def _literal_values(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [v for arg in typing.get_args(annotation) for v in _literal_values(arg)]


# right after the default (and its parenthesis): ", in [a, b]" (parentheses: open ends) or
# ", at least a"; a bound that names another setting is not read
_BOUNDS = re.compile(
    r"^(?:`[^`]*`|[^\s,]+)(?: \([^)]*\))?, "
    r"(?:in ([\[(])([^,\])]+), ([^\])]+)([\])])|at least (\d[\d.]*(?: [KMG]iB)?))"
)
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _number(text: str) -> float | None:
    """``1000000``, ``0.5``, ``64 KiB``; None for anything else (another setting's name)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(?: ([KMG]iB))?", text.strip())
    if m is None:
        return None
    return float(m.group(1)) * _UNITS.get(m.group(2) or "", 1)


def stated_bounds(part: str) -> list[tuple[str, float]]:
    """The bounds a part states after its default, as (``ge`` | ``gt`` | ``le`` | ``lt``, x)."""
    m = _BOUNDS.match(part)
    if m is None:
        return []
    opening, low, high, closing, at_least = m.groups()
    written = [("ge" if opening == "[" else "gt", low), ("le" if closing == "]" else "lt", high)]
    if at_least is not None:
        written = [("ge", at_least)]
    return [(kind, v) for kind, text in written if (v := _number(text)) is not None]


def code_bounds(field: FieldInfo) -> set[tuple[str, float]]:
    kinds = {Ge: "ge", Gt: "gt", Le: "le", Lt: "lt"}
    return {
        (kinds[type(m)], float(getattr(m, kinds[type(m)])))
        for m in field.metadata
        if type(m) in kinds
    }


def test_every_stated_range_is_the_code_range() -> None:
    settings = code_settings()
    wrong = [
        f"{name}: README {bound}, code {sorted(code_bounds(settings[name]))}"
        for row in readme_rows()
        for name, part in stated_parts(row).items()
        for bound in stated_bounds(part)
        if bound not in code_bounds(settings[name])
    ]
    assert wrong == [], "README ranges that are not the code's:\n" + "\n".join(wrong)
