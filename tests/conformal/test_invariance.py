"""Certification does not depend on the scale or offset of the retriever's scores.

The global min-max normalisation (seed 000, Sec. 3.2) absorbs any map
``s -> a*s + b`` with ``a > 0``: a retriever whose scores are shifted or rescaled
(cosine vs. dot product of scaled vectors, a score reported in percent) must get
the same trusted sets. On a dyadic grid with power-of-two scales the arithmetic
is exact, so the certificates must be identical; for arbitrary real (a, b) they
may differ only for scores within rounding distance of the threshold.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.conformal.calibrator import ConformalCalibration, RetrievalCalibrator
from sidecar.conformal.certify import Certification, certify
from sidecar.exceptions import InputError

K = 4
GRID = 1024  # scores are multiples of 1/1024

rows = st.lists(st.integers(0, GRID), min_size=K, max_size=K)
data = st.lists(
    st.tuples(rows, st.lists(st.booleans(), min_size=K, max_size=K)), min_size=3, max_size=30
)
alphas = st.sampled_from([0.05, 0.1, 0.25, 0.5, 0.9])


def _certify_or_reason(row: list[float], cal: ConformalCalibration) -> Certification | str:
    try:
        return certify(row, cal)
    except InputError as exc:
        return exc.reason


def _calibrate(
    scores: list[list[float]], labels: list[list[bool]], alpha: float
) -> RetrievalCalibrator:
    return RetrievalCalibrator(alpha).fit(scores).calibrate(scores, labels)


def _pair(
    base: list[list[float]], moved: list[list[float]], labels: list[list[bool]], alpha: float
) -> tuple[ConformalCalibration, ConformalCalibration] | None:
    """Both calibrations, or None when both are refused alike: random labels can make the
    correct chunks score clearly lower, which reads as distances (``score-direction``); the
    order of the scores, and so that refusal, does not change under ``a > 0``."""
    try:
        c0 = _calibrate(base, labels, alpha).calibration_
    except InputError as exc:
        assert exc.reason == "score-direction"
        with pytest.raises(InputError, match="look like distances"):
            _calibrate(moved, labels, alpha)
        return None
    return c0, _calibrate(moved, labels, alpha).calibration_


@settings(max_examples=200, deadline=None)
@given(
    cal=data,
    test=st.lists(rows, min_size=1, max_size=10),
    alpha=alphas,
    log2_scale=st.integers(-6, 6),
    shift=st.integers(-8 * GRID, 8 * GRID),
)
def test_exact_invariance_on_a_dyadic_grid(
    cal: list[tuple[list[int], list[bool]]],
    test: list[list[int]],
    alpha: float,
    log2_scale: int,
    shift: int,
) -> None:
    labels = [y for _, y in cal]
    base = [[s / GRID for s in row] for row, _ in cal]
    if max(map(max, base)) == min(map(min, base)):
        return  # all scores equal: nothing to normalise (covered elsewhere)
    a, b = 2.0**log2_scale, shift / GRID

    def moved(rows_: list[list[float]]) -> list[list[float]]:
        return [[a * s + b for s in row] for row in rows_]

    pair = _pair(base, moved(base), labels, alpha)
    if pair is None:
        return
    c0, c1 = pair
    assert (c1.k, c1.n, c1.q_hat, c1.threshold) == (c0.k, c0.n, c0.q_hat, c0.threshold)
    test_base = [[s / GRID for s in row] for row in test]
    for r0, r1 in zip(test_base, moved(test_base), strict=True):
        x, y = _certify_or_reason(r0, c0), _certify_or_reason(r1, c1)
        if isinstance(x, str) or isinstance(y, str):  # out of range: rejected alike
            assert x == y
            continue
        assert (x.trusted_indices, x.m1, x.m2, x.n_clipped) == (
            y.trusted_indices,
            y.m1,
            y.m2,
            y.n_clipped,
        )
        assert x.normalised_scores == y.normalised_scores


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    alpha=alphas,
    scale=st.floats(1e-3, 1e3),
    shift=st.floats(-1e3, 1e3),
)
def test_invariance_for_real_affine_maps(
    seed: int, alpha: float, scale: float, shift: float
) -> None:
    rng = np.random.default_rng(seed)
    cal = rng.normal(0.5, 0.2, size=(40, K))
    labels = (rng.random((40, K)) < 0.3).tolist()
    test = rng.normal(0.5, 0.25, size=(20, K))
    pair = _pair(cal.tolist(), (scale * cal + shift).tolist(), labels, alpha)
    if pair is None:
        return
    c0, c1 = pair
    assert (c1.k, c1.n) == (c0.k, c0.n)
    assert c1.q_hat == c0.q_hat or abs(c1.q_hat - c0.q_hat) < 1e-9
    for r0, r1 in zip(test.tolist(), (scale * test + shift).tolist(), strict=True):
        x, y = certify(r0, c0), certify(r1, c1)
        differ = set(x.trusted_indices) ^ set(y.trusted_indices)
        # only scores within rounding distance of the threshold may flip
        assert all(abs(x.normalised_scores[j] - c0.threshold) < 1e-9 for j in differ)
        np.testing.assert_allclose(x.normalised_scores, y.normalised_scores, atol=1e-9)
