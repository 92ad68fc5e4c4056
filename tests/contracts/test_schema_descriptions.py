"""Every property of every shipped schema says what it means.

A team consuming verdicts from another language reads only ``schemas/``: a
property without a ``description`` (its unit, range, when it is null, which
keys a map holds, which values a string takes) leaves it guessing from the
name. The schemas are generated from the models, so the description belongs on
the model's ``Field``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.conformal.mondrian import FallbackReason
from sidecar.contracts.verdicts import SCORES_RISING
from tests.conftest import REPO

SHIPPED = sorted((REPO / "schemas").glob("*.json"))


def _undescribed(node: Any, where: str = "") -> Iterator[str]:
    """The path of every property (at any depth, ``$defs`` included) without a description."""
    if isinstance(node, dict):
        properties = node.get("properties")
        if isinstance(properties, dict):
            for name, spec in properties.items():
                text = spec.get("description") if isinstance(spec, dict) else None
                if not isinstance(text, str) or not text.strip():
                    yield f"{where}/properties/{name}"
        for key, value in node.items():
            yield from _undescribed(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _undescribed(value, f"{where}/{i}")


def test_the_walk_finds_nested_undescribed_properties() -> None:
    schema = {
        "properties": {"a": {"type": "string", "description": "A"}, "b": {"type": "string"}},
        "$defs": {"Inner": {"properties": {"c": {"description": " "}, "d": {"$ref": "#"}}}},
    }
    assert list(_undescribed(schema)) == [
        "/properties/b",
        "/$defs/Inner/properties/c",
        "/$defs/Inner/properties/d",
    ]


def test_every_event_and_the_policy_are_shipped() -> None:
    names = {path.name for path in SHIPPED}
    assert {"answer.verdict.schema.json", "policy.schema.json", "asyncapi.json"} <= names
    assert len(names) >= 11


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_property_has_a_description(path: Path) -> None:
    missing = list(_undescribed(json.loads(path.read_text(encoding="utf-8"))))
    assert missing == [], (
        f"{path.name}: {len(missing)} properties without a description (add "
        f"Field(description=...) to the model, then `guardrail schemas export`): {missing}"
    )


def test_fallback_reason_names_every_value_the_sidecar_writes() -> None:
    # a consumer switches on fallback_reason: the schema must list every value the code
    # produces (the registry's fallbacks and the certifier's rising scores)
    schema = json.loads((REPO / "schemas" / "answer.verdict.schema.json").read_text())
    text = schema["$defs"]["RetrievalSignal"]["properties"]["fallback_reason"]["description"]
    values = [reason.value for reason in FallbackReason] + [SCORES_RISING]
    assert [v for v in values if v not in text] == []
