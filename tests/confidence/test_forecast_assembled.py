"""A chunk forecast built without validation is the one validation builds, or is validated.

``chunk_forecast`` skips pydantic's validation when its values pass its checks; on
any value (NaN, infinities, numpy floats, out of range, a negative or boolean rank)
it must return what ``ChunkForecast(...)`` returns (the same fields, types, order and
bytes) or raise the same error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sidecar.confidence.scorer import chunk_forecast
from sidecar.contracts.codec import encode
from sidecar.contracts.verdicts import ChunkForecast


def _built(build: Any, chunk_id: Any, p: Any, rank: Any) -> tuple[str, Any]:
    try:
        forecast = build(chunk_id, p, rank)
    except ValidationError as exc:
        return "error", exc.errors(include_url=False)
    fields = [(k, type(v), v) for k, v in forecast.__dict__.items()]
    return "forecast", (fields, forecast.model_fields_set, encode(forecast))


def _validated(chunk_id: Any, p: Any, rank: Any) -> ChunkForecast:
    return ChunkForecast(chunk_id=chunk_id, p_useful=p, retrieval_rank=rank)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(
    chunk_id=st.text(max_size=4),
    p=st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=0.0, max_value=1.0)
    | st.floats(min_value=0.0, max_value=1.0).map(np.float64)
    | st.integers(min_value=-1, max_value=2)
    | st.booleans(),
    rank=st.integers(min_value=-2, max_value=5) | st.booleans() | st.just(1.0),
)
@example(chunk_id="c", p=math.nan, rank=0)
@example(chunk_id="c", p=math.nextafter(1.0, 2.0), rank=0)
@example(chunk_id="c", p=-0.0, rank=0)
def test_the_forecast_is_the_validated_one_or_the_same_error(
    chunk_id: str, p: float, rank: int
) -> None:
    assert _built(chunk_forecast, chunk_id, p, rank) == _built(_validated, chunk_id, p, rank)
