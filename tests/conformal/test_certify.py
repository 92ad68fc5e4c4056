"""The per-event certificate (seed 000, eqs. 4-6)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.conformal.artifact import CalibrationArtifact, build_artifact
from sidecar.conformal.calibrator import ConformalCalibration, RetrievalCalibrator
from sidecar.conformal.certify import OUT_OF_RANGE_SPANS, certify
from sidecar.conformal.mondrian import CalibrationKey, FallbackReason, MondrianCalibrator
from sidecar.conformal.monitor import ExchangeabilityMonitor
from sidecar.conformal.registry import CalibrationRegistry, ResolvedCalibration
from sidecar.conformal.signal import ConformalCertifier
from sidecar.contracts.events import RetrievalEvent
from sidecar.exceptions import InputError
from tests.conformal.conftest import synthetic

RAW = [[6.0, 4.0, 2.5], [5.0, 3.0], [5.5, 4.5, 2.0]]
LABELS = [[True, False, False], [True, False], [False, True, False]]


def _calibration(alpha: float = 0.5) -> ConformalCalibration:
    # n1 = 2, n2 = 6, threshold 0.75 (raw 5.0) at alpha = 0.5; see test_calibrator
    return RetrievalCalibrator(alpha).fit(RAW).calibrate(RAW, LABELS).calibration_


def test_trusted_set_and_metrics() -> None:
    cert = certify([5.5, 5.0, 4.9, 1.0, 7.0], _calibration(), calibration_id="toy")
    assert cert.trusted_indices == (0, 1, 4)
    assert cert.m1 is True
    assert cert.m2 == pytest.approx(3 / 5)
    assert cert.depth == 5
    assert cert.n_clipped == 2  # 1.0 < n1 and 7.0 > n2
    assert cert.normalised_scores == pytest.approx((0.875, 0.75, 0.725, 0.0, 1.0))
    assert (cert.q_hat, cert.threshold, cert.alpha) == (0.25, 0.75, 0.5)
    assert cert.certifiable
    assert (cert.calibration_id, cert.calibration_key, cert.fallback) == ("toy", "global", False)


def test_nothing_trusted() -> None:
    cert = certify([2.0, 3.0], _calibration())
    assert (cert.trusted_indices, cert.m1, cert.m2) == ((), False, 0.0)


def test_empty_retrieval_and_requested_depth() -> None:
    cert = certify([], _calibration())
    assert (cert.m1, cert.m2, cert.depth) == (False, 0.0, 0)
    cert = certify([6.0, 2.0], _calibration(), depth=4)  # asked for 4, got 2
    assert cert.m2 == 0.25
    with pytest.raises(InputError) as info:
        certify([6.0, 2.0, 3.0], _calibration(), depth=2)
    assert info.value.reason == "invalid-depth"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "0.5", None, True, [0.1]])
def test_invalid_scores_go_to_the_dead_letter_topic(bad: Any) -> None:
    with pytest.raises(InputError) as info:
        certify([5.0, bad], _calibration())
    assert info.value.reason == "invalid-score"
    assert info.value.dead_letter
    assert "score 1" in info.value.detail


def test_vacuous_calibration_trusts_everything_and_says_so() -> None:
    cal = _calibration(0.2)  # k = 4 > n = 3
    cert = certify([2.0, 6.0, 1.0], cal)
    assert cert.trusted_indices == (0, 1, 2)
    assert (cert.m1, cert.m2) == (True, 1.0)
    assert not cert.certifiable
    assert (cert.q_hat, cert.threshold) == (None, None)


def test_resolved_calibration_carries_key_and_fallback() -> None:
    resolved = ResolvedCalibration(
        calibration=_calibration(),
        calibration_id="r@c:abc",
        requested=CalibrationKey("t", "c", "r"),
        used_key="global",
        fallback_reason=FallbackReason.UNKNOWN_KEY,
        detail="...",
    )
    cert = certify([5.0], resolved)
    assert cert.calibration_id == "r@c:abc"
    assert (cert.calibration_key, cert.requested_key) == ("global", "t/c/r")
    assert (cert.fallback, cert.fallback_reason) == (True, "unknown-key")
    assert cert.alpha == float(_calibration().alpha)


def test_resolved_calibration_works_out_what_each_certification_reads_once() -> None:
    """The label (escaped), the reason's text and alpha, as each certification read them."""
    key = CalibrationKey("org/team", "c%1", "r")
    own = ResolvedCalibration(_calibration(), "id", key, key.label, None, "")
    assert (own.requested_label, own.reason_text) == ("org%2Fteam/c%251/r", None)
    assert own.alpha == float(_calibration().alpha) and type(own.alpha) is float
    other = ResolvedCalibration(_calibration(), "id", key, "global", FallbackReason.UNKNOWN_KEY, "")
    assert other.reason_text == "unknown-key" == str(FallbackReason.UNKNOWN_KEY)
    assert certify([5.0], other).requested_key == key.label


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    alpha=st.sampled_from([0.05, 0.1, 0.3, 0.8]),
    scores=st.lists(st.floats(-1.0, 2.0, allow_nan=False), max_size=12),
)
def test_same_decisions_as_the_vectorised_calibrator(
    seed: int, alpha: float, scores: list[float]
) -> None:
    data = synthetic(np.random.default_rng(seed), 30)
    cal = RetrievalCalibrator(alpha).fit(data.scores).calibrate(data.scores, data.labels)
    n1, n2 = cal.calibration_.n1, cal.calibration_.n2
    margin = OUT_OF_RANGE_SPANS * (n2 - n1)
    if any(not n1 - margin <= s <= n2 + margin for s in scores):
        with pytest.raises(InputError) as err:
            certify(scores, cal.calibration_)
        assert err.value.reason == "score-out-of-range"
        return
    cert = certify(scores, cal.calibration_)
    mask = cal.predict(scores).tolist()
    assert cert.trusted_indices == tuple(j for j, t in enumerate(mask) if t)
    normalised, clipped = cal.calibration_.normaliser.transform(scores)
    assert list(cert.normalised_scores) == normalised.tolist()
    assert cert.n_clipped == clipped


@pytest.mark.parametrize("score", [1e308, -1e308, 1e300, 10.0, -5.0])
def test_absurd_but_finite_scores_are_rejected_not_trusted(score: float) -> None:
    data = synthetic(np.random.default_rng(0), 30)
    cal = RetrievalCalibrator(0.1).fit(data.scores).calibrate(data.scores, data.labels)
    with pytest.raises(InputError) as err:
        certify([0.5, score], cal.calibration_)
    assert err.value.reason == "score-out-of-range"
    assert "not trusted" in err.value.detail


def test_a_vacuous_calibration_certifies_nothing_in_the_served_signal() -> None:
    """k > n: the conformal set is every chunk, which certifies none. The sidecar's signal
    says so everywhere it is read: no trusted chunk (claims' evidence scope, fleet coverage,
    the confidence features), and the exchangeability monitor is not fed a constant m1."""
    key = CalibrationKey("t", "c", "r")
    # 5 questions, one correct chunk each: n = 5 < 9, too few for alpha = 0.1
    scores = [[0.9, 0.5, 0.3], [0.8, 0.6, 0.2], [0.85, 0.4, 0.1], [0.7, 0.6, 0.3], [0.9, 0.2, 0.1]]
    labels = [[True, False, False]] * 5
    fitted = MondrianCalibrator(0.1).fit(scores, [key] * 5).calibrate(scores, labels, [key] * 5)
    artifact = build_artifact(
        fitted.calibration_,
        global_key=key,
        embedding_model_id="e",
        data_hash="0" * 64,
        beta=0.0,
        s_thres=None,
        top_k=3,
    )
    artifact = CalibrationArtifact.loads(artifact.dumps())  # as the sidecar loads it
    monitor = ExchangeabilityMonitor(min_samples=1, window=10)
    certifier = ConformalCertifier(CalibrationRegistry(artifact), monitor)
    event = RetrievalEvent.model_validate(
        {
            "request_id": "r1",
            "tenant": "t",
            "collection": "c",
            "retriever": "r",
            "query": "q",
            "k": 3,
            "hits": [
                {"chunk_id": f"c{i}", "doc_id": "d", "score": s, "text": "x"}
                for i, s in enumerate([0.91, 0.5, 0.2])
            ],
        }
    )
    signal = certifier.certify(event)
    assert signal.certifiable is False and signal.q_hat is None
    assert (signal.trusted_chunk_ids, signal.m1, signal.m2) == ([], False, 0.0)
    assert signal.monitor is None and monitor.statuses() == {}
    # the certification itself keeps the conformal convention: the set is every chunk
    resolved = CalibrationRegistry(artifact).resolve("t", "c", "r")
    assert certify([0.91, 0.5, 0.2], resolved).trusted_indices == (0, 1, 2)


def test_a_score_below_the_calibrated_range_fails_a_zero_threshold() -> None:
    """k = n (n = 10 at alpha = 0.1) cuts at the smallest correct score; when that is n1
    the threshold is 0. A raw score below n1, inside the one-span margin, is clipped to 0
    for the report but is below the cut (s' < 0, eq. 4): not trusted."""
    raw = [[float(v)] for v in range(1, 11)]
    labels = [[True]] * 10
    cal = RetrievalCalibrator(0.1).fit(raw).calibrate(raw, labels).calibration_
    assert cal.threshold == 0.0
    cert = certify([5.0, 1.0, 0.5], cal)
    assert cert.trusted_indices == (0, 1)
    assert cert.m2 == pytest.approx(2 / 3)
    assert (cert.normalised_scores[2], cert.n_clipped) == (0.0, 1)
    key = CalibrationKey("t", "c", "r")
    mondrian = MondrianCalibrator(0.1).fit(raw, [key] * 10).calibrate(raw, labels, [key] * 10)
    assert mondrian.predict([5.0, 1.0, 0.5], key).tolist() == [True, True, False]
