"""The retrieval signal built without validation is the one validation builds, or is validated.

``retrieval_signal`` skips pydantic's validation when the values that need it pass
its checks; on any value (NaN, infinities, numpy floats, integers, out of range,
a monitor state that is not one) it must return what ``RetrievalSignal(**values)``
returns (the same fields, types, order and bytes) or raise the same error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sidecar.conformal.monitor import MonitorState
from sidecar.conformal.signal import retrieval_signal
from sidecar.contracts.codec import encode
from sidecar.contracts.verdicts import RetrievalSignal, SignalStatus

_numbers = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=0.0, max_value=1.0)
    | st.sampled_from([0.0, -0.0, 1.0, math.nextafter(1.0, 2.0), -1e-300, math.nan, math.inf])
    | st.integers(min_value=-2, max_value=2)
    | st.floats(min_value=0.0, max_value=1.0).map(np.float64)
    | st.booleans()
)


@st.composite
def _values(draw: st.DrawFn) -> dict[str, Any]:
    return {  # RetrievalSignal's fields, in its order
        "status": SignalStatus.OK,
        "trusted_chunk_ids": draw(st.lists(st.sampled_from(["c1", "c2"]), max_size=2)),
        "m1": draw(st.booleans()),
        "m2": draw(_numbers),
        "q_hat": draw(st.none() | _numbers),
        "alpha": draw(_numbers),
        "certifiable": draw(st.booleans()),
        "calibration_version": "r@c:0123456789ab",
        "calibration_key": draw(st.sampled_from(["global", "t/c/r"])),
        "fallback": draw(st.booleans()),
        "fallback_reason": draw(st.none() | st.just("unknown-collection")),
        "clipped_scores": draw(st.integers(min_value=0, max_value=3) | st.just(True) | _numbers),
        "monitor": draw(
            st.none()
            | st.sampled_from(["warming-up", "ok", "exchangeability-broken", "broken"])
            | st.sampled_from(list(MonitorState))  # equal to the strings, but not str itself
        ),
        "m1_mean": draw(st.none() | _numbers),
    }


def _built(values: dict[str, Any], build: Any) -> tuple[str, Any]:
    try:
        signal = build(dict(values))
    except ValidationError as exc:
        return "error", exc.errors(include_url=False)
    fields = [(k, type(v), v) for k, v in signal.__dict__.items()]
    return "signal", (fields, signal.model_fields_set, encode(signal))


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(values=_values())
def test_the_signal_is_the_validated_one_or_the_same_error(values: dict[str, Any]) -> None:
    assert _built(values, retrieval_signal) == _built(values, lambda v: RetrievalSignal(**v))


def test_a_served_signal_skips_validation_and_equals_it() -> None:
    values: dict[str, Any] = {
        "status": SignalStatus.OK,
        "trusted_chunk_ids": ["c1"],
        "m1": True,
        "m2": 1 / 3,
        "q_hat": 0.586,
        "alpha": 0.1,
        "certifiable": True,
        "calibration_version": "r@c:0123456789ab",
        "calibration_key": "global",
        "fallback": True,
        "fallback_reason": "unknown-collection",
        "clipped_scores": 1,
        "monitor": "warming-up",
        "m1_mean": None,
    }
    got = retrieval_signal(dict(values))
    assert got == RetrievalSignal(**values)
    assert _built(values, retrieval_signal) == _built(values, lambda v: RetrievalSignal(**v))


@pytest.mark.parametrize("field", ["m2", "alpha", "m1_mean", "q_hat"])
def test_a_nan_is_refused_as_validation_refuses_it(field: str) -> None:
    values: dict[str, Any] = {
        "status": SignalStatus.OK,
        "trusted_chunk_ids": [],
        "m1": False,
        "m2": 0.0,
        "q_hat": 0.5,
        "alpha": 0.1,
        "certifiable": True,
        "calibration_version": "v",
        "calibration_key": "global",
        "fallback": False,
        "fallback_reason": None,
        "clipped_scores": 0,
        "monitor": None,
        "m1_mean": None,
        field: math.nan,
    }
    with pytest.raises(ValidationError):
        retrieval_signal(values)
