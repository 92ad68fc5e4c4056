"""Every reason code the sidecar can put in a verdict is named in the published schema.

A consumer of ``rag.verdicts`` written from ``schemas/`` alone (a UI choosing
what to show, a metrics pipeline) matches on ``reasons[].code``; the codes it
can meet are those the serving code builds: ``Reason(code=...)``,
``finding(action, code, ...)`` in the policy's findings and ``_reason(code, ...)``
for certified allow. This test reads them from the source (a template such as
``f"{signal}-low"`` must match a catalogued code) and looks each up in the
``Reason.code`` description of ``schemas/answer.verdict.schema.json``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator

from sidecar.contracts.reasons import PROFILE_REASON_PREFIX, REASON_CODES
from sidecar.contracts.verdicts import SignalStatus
from sidecar.policy.config import SEVERITY
from sidecar.policy.findings import _missing
from tests.conftest import REPO

# where a reason code is the n-th positional argument (or the ``code`` keyword)
_CODE_ARGUMENT = {"Reason": None, "finding": 1, "_reason": 0}


def _published_codes() -> set[str]:
    schema = json.loads((REPO / "schemas" / "answer.verdict.schema.json").read_text())
    description = schema["$defs"]["Reason"]["properties"]["code"].get("description", "")
    return set(re.findall(r"^`([^`]+)`:", description, flags=re.MULTILINE))


def _code_arguments() -> Iterator[tuple[str, ast.expr]]:
    """(where, expression) of every reason code built in the serving code (not the lab)."""
    for path in sorted((REPO / "sidecar").rglob("*.py")):
        if "lab" in path.relative_to(REPO / "sidecar").parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            if node.func.id not in _CODE_ARGUMENT:
                continue
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            position = _CODE_ARGUMENT[node.func.id]
            for keyword in node.keywords:
                if keyword.arg == "code":
                    yield where, keyword.value
            if position is not None and len(node.args) > position:
                yield where, node.args[position]


def _as_pattern(expr: ast.expr) -> re.Pattern[str] | None:
    """A literal code or an f-string template as a pattern (``{...}``: any name); None when
    the code is computed otherwise (a variable: checked where its value is written)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return re.compile(re.escape(expr.value))
    if isinstance(expr, ast.JoinedStr):
        parts = []
        for value in expr.values:
            if isinstance(value, ast.Constant):
                parts.append(re.escape(str(value.value)))
            elif isinstance(value, ast.FormattedValue) and ast.unparse(value.value) == (
                "PROFILE_REASON_PREFIX"
            ):
                parts.append(re.escape(PROFILE_REASON_PREFIX))
            else:
                parts.append(r"[a-z0-9<>\-]+")
        return re.compile("".join(parts))
    return None


def _built_codes() -> set[str]:
    """The codes built from a template, each spelled out (``profile.<name>`` for any profile)."""
    built = {
        _missing(signal, status, action).reason.code
        for signal in ("retrieval", "lookback", "claims", "confidence")
        for status in (SignalStatus.NOT_CONFIGURED, SignalStatus.UNAVAILABLE)
        for action in SEVERITY
    }
    built |= {f"claims-reliability-{level.lower()}" for level in ("HIGH", "MEDIUM", "LOW")}
    built |= {f"{s}-{w}" for s in ("lookback", "confidence") for w in ("low", "very-low")}
    built.add(f"{PROFILE_REASON_PREFIX}<name>")
    return built


def test_every_reason_code_the_code_builds_is_published() -> None:
    published = _published_codes()
    found = list(_code_arguments())
    assert len(found) > 20, found  # the scan sees the policy's findings
    unpublished = []
    for where, expr in found:
        pattern = _as_pattern(expr)
        if pattern is None:
            continue
        if not any(pattern.fullmatch(code) for code in published):
            unpublished.append(f"{where}: {ast.unparse(expr)}")
    assert unpublished == [], f"reason codes missing from schemas/ (Reason.code): {unpublished}"
    assert _built_codes() - published == set()


def test_the_catalogue_names_only_codes_the_code_builds() -> None:
    literals = {
        e.value
        for _, e in _code_arguments()
        if isinstance(e, ast.Constant) and isinstance(e.value, str)
    }
    assert set(REASON_CODES) - literals - _built_codes() == set()
