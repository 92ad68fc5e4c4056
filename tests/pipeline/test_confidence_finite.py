"""A confidence result with any number not finite is left out of the verdict (scoring)."""

from __future__ import annotations

import math

import pytest

from sidecar.contracts.events import ChunkForecast
from sidecar.pipeline.ports import ConfidenceResult
from sidecar.pipeline.scoring import _confidence_is_finite


def _result(
    p: float | None = 0.5, feature: float | None = 0.25, chunk: float | None = 0.75
) -> ConfidenceResult:
    chunks = (
        ()
        if chunk is None
        else (ChunkForecast.model_construct(chunk_id="c", p_useful=chunk, retrieval_rank=0),)
    )
    return ConfidenceResult(
        p_correct=p, features={"a": 1.0, "b": feature, "c": None}, chunk_forecast=chunks
    )


def test_finite_results_and_missing_values_pass() -> None:
    assert _confidence_is_finite(_result())
    assert _confidence_is_finite(_result(p=None, feature=None, chunk=None))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["p", "feature", "chunk"])
def test_one_number_not_finite_anywhere_fails_the_result(where: str, bad: float) -> None:
    assert not _confidence_is_finite(_result(**{where: bad}))
