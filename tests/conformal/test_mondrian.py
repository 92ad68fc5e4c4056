"""Mondrian calibration per (tenant, collection, retriever) with a reported fallback."""

from __future__ import annotations

import pytest

from sidecar.conformal.calibrator import RetrievalCalibrator
from sidecar.conformal.mondrian import CalibrationKey, FallbackReason, MondrianCalibrator
from sidecar.exceptions import InputError, LifecycleError
from tests.conformal.conftest import Retrievals, SyntheticFactory

BIG = CalibrationKey("acme", "wiki", "minilm")
SMALL = CalibrationKey("acme", "wiki", "bm25")
FLAT = CalibrationKey("beta", "docs", "minilm")


def _data(make_retrievals: SyntheticFactory) -> tuple[Retrievals, list[CalibrationKey]]:
    big = make_retrievals(seed=10, n_questions=120)
    # 5 questions, one correct chunk each: n = 5 < 9 = the minimum for alpha = 0.1
    small = make_retrievals(seed=11, n_questions=5, correct_mean=2.0, wrong_mean=1.5)
    flat = Retrievals([[0.5, 0.5, 0.5]], [[True, False, False]])  # cannot be normalised
    scores = big.scores + small.scores + flat.scores
    labels = big.labels + small.labels + flat.labels
    keys = [BIG] * 120 + [SMALL] * 5 + [FLAT]
    return Retrievals(scores, labels), keys


def test_each_key_gets_its_own_calibration_or_a_reported_fallback(
    make_retrievals: SyntheticFactory,
) -> None:
    data, keys = _data(make_retrievals)
    m = MondrianCalibrator(0.1).fit(data.scores, keys).calibrate(data.scores, data.labels, keys)
    result = m.calibration_

    pooled = RetrievalCalibrator(0.1).fit(data.scores).calibrate(data.scores, data.labels)
    assert result.global_calibration == pooled.calibration_
    assert result.global_calibration.n == 120 + 5 + 1

    big = result.keys[BIG]
    alone = (
        RetrievalCalibrator(0.1)
        .fit(data.scores[:120])
        .calibrate(data.scores[:120], data.labels[:120])
    )
    assert big.own == alone.calibration_
    assert not big.uses_global
    assert result.select(BIG) == (alone.calibration_, big)

    small = result.keys[SMALL]
    assert small.fallback_reason is FallbackReason.TOO_FEW_SAMPLES
    assert small.own is not None
    assert (small.own.n, small.own.k) == (5, 6)  # ceil(6 * 0.9) = 6 > 5
    assert "acme/wiki/bm25" in small.detail
    assert "global calibration" in small.detail
    assert "needs n >= 9" in small.detail
    assert result.select(SMALL)[0] is result.global_calibration

    flat = result.keys[FLAT]
    assert flat.fallback_reason is FallbackReason.DEGENERATE_SCORES
    assert flat.own is None
    assert result.select(FLAT)[0] is result.global_calibration

    unknown = CalibrationKey("x", "y", "z")
    assert result.select(unknown) == (result.global_calibration, None)


def test_predict_uses_the_selected_calibration(make_retrievals: SyntheticFactory) -> None:
    data, keys = _data(make_retrievals)
    m = MondrianCalibrator(0.1).fit(data.scores, keys).calibrate(data.scores, data.labels, keys)
    g = m.calibration_.global_calibration
    own = m.calibration_.keys[BIG].own
    assert own is not None
    # the two cuts in raw-score units; a score halfway between them separates the calibrations
    raw_global = g.n1 + g.threshold * (g.n2 - g.n1)
    raw_own = own.n1 + own.threshold * (own.n2 - own.n1)
    assert raw_global != raw_own
    between = [(raw_global + raw_own) / 2]
    assert m.predict(between, BIG).tolist() == [raw_own < raw_global]
    assert m.predict(between, SMALL).tolist() == [raw_global < raw_own]


def test_lifecycle_and_key_checks(make_retrievals: SyntheticFactory) -> None:
    data, keys = _data(make_retrievals)
    m = MondrianCalibrator(0.1)
    with pytest.raises(LifecycleError):
        m.calibrate(data.scores, data.labels, keys)
    with pytest.raises(LifecycleError):
        _ = m.calibration_
    with pytest.raises(InputError) as info:
        m.fit(data.scores, keys[:-1])
    assert info.value.reason == "shape-mismatch"
    with pytest.raises(InputError) as info:
        m.fit(data.scores, [*keys[:-1], CalibrationKey("", "docs", "minilm")])
    assert info.value.reason == "invalid-key"
    m.fit(data.scores, keys)
    other = [*keys[:-1], CalibrationKey("new", "docs", "minilm")]
    with pytest.raises(LifecycleError, match="not seen by fit"):
        m.calibrate(data.scores, data.labels, other)
