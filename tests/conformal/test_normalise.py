"""Global min-max normalisation (seed 000, Sec. 3.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.conformal.normalise import MinMaxNormaliser
from sidecar.exceptions import ConfigError, InputError


def test_fit_takes_global_min_and_max() -> None:
    norm = MinMaxNormaliser.fit([[0.2, 0.6], [1.0, 0.4]])
    assert (norm.n1, norm.n2) == (0.2, 1.0)
    values, clipped = norm.transform([0.2, 0.6, 1.0])
    assert clipped == 0
    np.testing.assert_allclose(values, [0.0, 0.5, 1.0])


def test_values_outside_the_range_are_clipped_and_counted() -> None:
    norm = MinMaxNormaliser(0.0, 2.0)
    values, clipped = norm.transform([-1.0, 0.5, 3.0, 2.0])
    assert clipped == 2
    assert values.tolist() == [0.0, 0.25, 1.0, 1.0]
    scalar, clipped_scalar = norm.transform_values([-1.0, 0.5, 3.0, 2.0])
    assert (scalar, clipped_scalar) == ([0.0, 0.25, 1.0, 1.0], 2)


def test_nan_padding_passes_through_uncounted() -> None:
    values, clipped = MinMaxNormaliser(0.0, 1.0).transform([0.5, math.nan])
    assert clipped == 0
    assert math.isnan(values[1])


@pytest.mark.parametrize("scores", [[], [0.3, 0.3, 0.3]])
def test_degenerate_scores(scores: list[float]) -> None:
    with pytest.raises(InputError) as info:
        MinMaxNormaliser.fit(scores)
    assert info.value.reason == "degenerate-scores"


def test_non_finite_calibration_scores() -> None:
    with pytest.raises(InputError) as info:
        MinMaxNormaliser.fit([0.1, math.nan])
    assert info.value.reason == "invalid-score"


@pytest.mark.parametrize(("n1", "n2"), [(1.0, 1.0), (2.0, 1.0), (0.0, math.inf)])
def test_bad_parameters(n1: float, n2: float) -> None:
    with pytest.raises(ConfigError):
        MinMaxNormaliser(n1, n2)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "x", None])
def test_scalar_path_rejects_bad_scores(bad: object) -> None:
    with pytest.raises(InputError) as info:
        MinMaxNormaliser(0.0, 1.0).transform_values([0.5, bad])  # type: ignore[list-item]
    assert info.value.reason == "invalid-score"


finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@settings(max_examples=200, deadline=None)
@given(cal=st.lists(finite, min_size=2, max_size=30), test=st.lists(finite, max_size=30))
def test_scalar_and_vector_paths_agree_bitwise(cal: list[float], test: list[float]) -> None:
    if max(cal) == min(cal):
        return
    norm = MinMaxNormaliser.fit(cal)
    vec, n_vec = norm.transform(np.asarray(test, dtype=np.float64))
    sca, n_sca = norm.transform_values(test)
    assert n_vec == n_sca
    assert vec.tolist() == sca
    assert all(0.0 <= v <= 1.0 for v in sca)
