"""``answer_verdict_json`` refuses what the model refuses, whatever the values add up to.

Timings and confidence features are checked by their sum first (a NaN or an infinity
makes it one); a sum that is not finite is looked into value by value, so finite values
whose sum overflows are written, as the model writes them, and a NaN hidden among
zeros and ``None`` is still refused.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from sidecar.contracts.answer_json import answer_verdict_json
from sidecar.contracts.codec import encode
from sidecar.contracts.events import AnswerVerdict, Decision, Signals


def _values(**extra: Any) -> dict[str, Any]:
    return {
        "request_id": "r-1",
        "idempotency_key": "k",
        "tenant": None,
        "decision": Decision.ALLOW,
        "reasons": [],
        "policy": "p/1",
        "signals": Signals(),
        "produced_at": datetime(2026, 1, 1, 2, 3, 4, 5678, tzinfo=UTC),
        "sidecar_version": "0",
        **extra,
    }


@pytest.mark.parametrize(
    "extra",
    [
        {"timings_ms": {"a": 1e308, "b": 1e308}},  # finite, the sum overflows
        {"timings_ms": {"a": -1e308, "b": -1e308, "c": 0.0}},
        {"confidence_features": {"a": 1e308, "b": 1e308, "c": None}},
        {"confidence_features": {"a": 0.0, "b": None, "c": -0.5}},
        {"confidence_features": {}, "timings_ms": {}},
        {"produced_at": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))},
        {"produced_at": datetime(2026, 1, 1, tzinfo=timezone(timedelta(seconds=30)))},
    ],
)
def test_finite_values_are_written_as_the_model_writes_them(extra: dict[str, Any]) -> None:
    values = _values(**extra)
    assert answer_verdict_json(**values) == encode(AnswerVerdict(**values))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("timings_ms", {"a": math.inf, "b": -math.inf}),  # the sum is NaN
        ("timings_ms", {"a": 1.0, "b": -math.inf}),
        ("timings_ms", {"a": math.nan}),
        ("confidence_features", {"a": 0.0, "b": None, "c": math.nan}),
        ("confidence_features", {"a": math.inf, "b": -math.inf, "c": None}),
        ("confidence_features", {"a": 1e308, "b": 1e308, "c": math.inf}),
    ],
)
def test_a_nan_or_infinity_is_refused_however_the_values_add_up(
    name: str, value: dict[str, float | None]
) -> None:
    with pytest.raises(ValueError, match=name):
        answer_verdict_json(**_values(**{name: value}))
