"""The README's dead-letter table lists every reason the sidecar can put in ``x-dlq-reason``.

A dead letter's reason is the ``reason`` of the :class:`~sidecar.exceptions.InputError`
that refused the record (``sidecar/pipeline/deadletters.py``). This test reads every
``InputError(reason, ...)`` the serving code builds from the source: a literal, a
module constant (``KEY_MISMATCH``), or a variable whose values are spelled out in the
function that raises it (``reason in ("batch-too-large", ...)``, ``reason = "..."``).
Left out: the conformal fitting modules, the library of ``guardrail calibrate``, which
raise ``InputError`` for bad labelled data that the command reports (no record, no DLQ).

The README side is the first cell of each row of the table headed ``reason``; the
reasons ``schemas/dead-letter.schema.json`` gives as examples must be among them.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path

from sidecar.contracts.deadletter import DeadLetterRecord
from sidecar.dlq.reasons import NOT_REDRIVABLE, REDRIVABLE
from tests.conftest import REPO
from tests.docs.markdown import code_spans, readme_text, table_headed

SIDECAR = REPO / "sidecar"
_SLUG = re.compile(DeadLetterRecord.model_json_schema()["properties"]["reason"]["pattern"])
# raise InputError for data given to ``guardrail calibrate``, never for a consumed record
FITTING = {
    SIDECAR / "conformal" / name
    for name in ("calibrator.py", "mondrian.py", "normalise.py", "quantile.py")
}


def _serving_modules() -> Iterator[Path]:
    for path in sorted(SIDECAR.rglob("*.py")):
        if "lab" in path.relative_to(SIDECAR).parts or "cli" in path.relative_to(SIDECAR).parts:
            continue  # the lab (training, chaos) and the commands: no consumed records
        if path not in FITTING:
            yield path


def _constants(tree: ast.Module) -> dict[str, str]:
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _values_of(name: str, function: ast.AST) -> set[str]:
    """The string literals ``function`` gives the variable ``name``: assigned to it (also in
    a tuple assignment) or tested with ``name in (...)``."""
    values: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (
                    zip(target.elts, node.value.elts, strict=False)
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    else [(target, node.value)]
                )
                values |= {
                    v.value
                    for t, v in pairs
                    if isinstance(t, ast.Name)
                    and t.id == name
                    and isinstance(v, ast.Constant)
                    and isinstance(v.value, str)
                }
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id == name
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and isinstance(node.comparators[0], ast.Tuple | ast.Set | ast.List)
        ):
            values |= {
                e.value
                for e in node.comparators[0].elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return values


@functools.cache
def code_reasons() -> dict[str, str]:
    """Every dead-letter reason the serving code can raise -> one place that raises it."""
    sources = {path: path.read_text(encoding="utf-8") for path in _serving_modules()}
    trees = {path: ast.parse(text) for path, text in sources.items() if "InputError" in text}
    constants = {k: v for tree in trees.values() for k, v in _constants(tree).items()}
    found: dict[str, str] = {}
    unreadable = []
    for path, tree in trees.items():
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "InputError"
                ):
                    continue
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
                reason = node.args[0] if node.args else reason
                if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                    values = {reason.value}
                elif isinstance(reason, ast.Name) and reason.id in constants:
                    values = {constants[reason.id]}
                elif isinstance(reason, ast.Name):
                    values = _values_of(reason.id, function)
                else:
                    values = set()
                if not values:
                    unreadable.append(where)
                found.update(dict.fromkeys(values - set(found), where))
    assert unreadable == [], (
        f"InputError reasons this test cannot read: {unreadable}; use a literal or a "
        "module constant"
    )
    return found


def readme_reasons() -> list[str]:
    table = table_headed(readme_text(), "reason")
    reasons = []
    for cells in table.rows:
        spans = code_spans(cells[0])
        assert len(spans) == 1, f"README dead-letter row: one reason in code, got {cells[0]!r}"
        reasons.append(spans[0])
    return reasons


def schema_examples() -> set[str]:
    schema = json.loads((REPO / "schemas" / "dead-letter.schema.json").read_text())
    description: str = schema["properties"]["reason"]["description"]
    examples = re.split(r"[.;]", description.split("e.g.", 1)[1], maxsplit=1)[0]
    return set(re.findall(r"[a-z0-9][a-z0-9\-]+-[a-z0-9\-]+", examples))


def test_every_reason_the_sidecar_raises_is_in_the_readme() -> None:
    raised = code_reasons()
    assert len(raised) > 20, raised  # the scan reads the codec, the intake and the signals
    missing = {r: where for r, where in raised.items() if r not in readme_reasons()}
    assert missing == {}, f"dead-letter reasons missing from the README's table: {missing}"


def test_the_readme_lists_only_reasons_the_sidecar_raises_once_each() -> None:
    listed = readme_reasons()
    assert len(listed) == len(set(listed)), f"listed twice: {sorted(listed)}"
    unknown = sorted(set(listed) - set(code_reasons()))
    assert unknown == [], f"the README lists dead-letter reasons nothing raises: {unknown}"
    assert [r for r in listed if not _SLUG.fullmatch(r) or len(r) > 64] == []


def test_the_schema_examples_are_reasons_the_readme_lists() -> None:
    examples = schema_examples()
    assert len(examples) >= 5, examples
    unlisted = sorted(examples - set(readme_reasons()))
    assert unlisted == [], (
        f"schemas/dead-letter.schema.json gives reasons the README lacks: {unlisted}"
    )


def test_the_readme_says_which_reasons_a_redrive_sends_as_the_command_does() -> None:
    """The table's ``guardrail dlq redrive`` column is :mod:`sidecar.dlq.reasons`: ``no``
    for a reason the command refuses, ``yes, once …`` naming what must change first."""
    table = table_headed(readme_text(), "reason")
    column = table.header.index("`guardrail dlq redrive`")
    said = {code_spans(cells[0])[0]: cells[column].replace("`", "") for cells in table.rows}
    expected = {r: "no" for r in NOT_REDRIVABLE} | {
        r: f"yes, once {what}" for r, what in REDRIVABLE.items()
    }
    assert said == expected
