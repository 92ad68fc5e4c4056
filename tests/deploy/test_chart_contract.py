"""The Helm chart and the sidecar's settings describe the same configuration.

The chart turns values into ``GUARDRAIL_<SECTION>__<FIELD>`` variables and
``Settings.load()`` refuses unknown sections, so a variable the chart sets
that the settings model does not know would crash every pod at start-up. These
checks read the chart's sources (no helm binary needed; scripts/helm-check.sh
renders and validates the manifests themselves).
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sidecar.config import TOPIC_ROLES, KafkaSettings, Settings
from sidecar.telemetry_setup import SAMPLERS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "guardrail-sidecar"

_ENV_NAME = re.compile(r"^\s*- name: (GUARDRAIL_[A-Z0-9_]+)\s*$", re.MULTILINE)


def chart_env_names() -> list[str]:
    names = sorted(set(_ENV_NAME.findall((CHART / "templates" / "_sidecar.tpl").read_text())))
    assert names, "no GUARDRAIL_* variables found in templates/_sidecar.tpl"
    return names


def values_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def literal_values(model: type[BaseModel], field: str) -> set[str]:
    """The allowed strings of a ``Literal[...]`` (or ``Literal[...] | None``) field."""
    annotation = model.model_fields[field].annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return {str(a) for a in args}
    literals = [a for a in args if typing.get_origin(a) is typing.Literal]
    assert literals, f"{model.__name__}.{field} is not a Literal"
    return {str(v) for lit in literals for v in typing.get_args(lit)}


def setting_for(env_name: str) -> str | None:
    """The settings path an env name addresses, or None when the model lacks it."""
    parts = env_name.removeprefix("GUARDRAIL_").lower().split("__")
    model: type[BaseModel] = Settings
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return None
        if depth < len(parts) - 1:
            nested = field.annotation
            if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
                return None
            model = nested
    return ".".join(parts)


def test_every_variable_the_chart_sets_is_a_setting() -> None:
    unknown = [name for name in chart_env_names() if setting_for(name) is None]
    assert not unknown, (
        f"the chart sets {unknown}, which sidecar.config.Settings does not define; "
        "Settings.load() would refuse them and every pod would fail to start"
    )


def test_chart_enums_match_the_settings() -> None:
    props = values_schema()["properties"]
    kafka = props["kafka"]["properties"]
    assert set(kafka["securityProtocol"]["enum"]) == literal_values(
        KafkaSettings, "security_protocol"
    )
    assert set(kafka["sasl"]["properties"]["mechanism"]["enum"]) - {""} == literal_values(
        KafkaSettings, "sasl_mechanism"
    )
    assert set(kafka["autoOffsetReset"]["enum"]) == literal_values(
        KafkaSettings, "auto_offset_reset"
    )
    assert set(kafka["isolationLevel"]["enum"]) - {""} == literal_values(
        KafkaSettings, "isolation_level"
    )
    assert set(props["logLevel"]["enum"]) == literal_values(Settings, "log_level")
    # the sampler names guardrail run accepts (the SDK's): a typo fails at install
    assert set(props["otel"]["properties"]["sampler"]["enum"]) - {""} == set(SAMPLERS)


def test_chart_topic_names_follow_kafka_rules_like_the_settings() -> None:
    topics = values_schema()["properties"]["topics"]["properties"]
    legal = re.compile(topics["verdicts"]["pattern"])
    for name in ("rag.verdicts", "a" * 249, "with_underscore-and.dot"):
        assert legal.match(name)
    for name in ("", "a" * 250, "has space", "slash/topic"):
        assert not legal.match(name)
    for key in TOPIC_ROLES:
        assert topics[key]["pattern"] == topics["verdicts"]["pattern"]
