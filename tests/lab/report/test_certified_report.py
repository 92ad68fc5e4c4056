"""The report's certified-allow numbers: allow rate, error among allowed, the curve."""

from __future__ import annotations

import json

import pytest

from sidecar.lab.report.evaluate import Replayed, build_report
from sidecar.stats.binomial import clopper_pearson
from tests.lab.report.test_train_evaluate import six_rows


def certified(rows: list[Replayed], risk: float = 0.4, delta: float = 0.1) -> list[Replayed]:
    """The same rows, decided under a certificate (every verdict carries its terms)."""
    return [
        Replayed(r.row, {**r.verdict, "certified_risk": risk, "certified_delta": delta}, r.claims)
        for r in rows
    ]


def test_allow_rate_and_error_among_allowed_by_hand() -> None:
    report = build_report(certified(six_rows()))
    # allowed: qid 1, 2 right and qid 3 wrong
    assert report["allow_rate"] == pytest.approx(0.5)
    assert report["error_rate_allowed"] == pytest.approx(1 / 3)
    low, high = clopper_pearson(1, 3, 0.95)
    assert report["error_rate_allowed_interval"] == [pytest.approx(low), pytest.approx(high)]
    assert report["certified_risk"] == pytest.approx(0.4)
    cert = report["certified_allow"]
    assert cert["certified_delta"] == pytest.approx(0.1)
    assert cert["certified_answers"] == 6
    assert cert["within_certified_risk"] is True  # low end 0.008 <= 0.4
    json.dumps(report, allow_nan=False)


def test_risk_coverage_curve_by_hand() -> None:
    curve = build_report(six_rows())["certified_allow"]["risk_coverage"]
    by_t = {c["threshold"]: c for c in curve}
    # confidence 0.9, 0.8, 0.7 (wrong), 0.6, 0.3 (wrong), 0.2 (wrong)
    assert by_t[0.9] == {
        "threshold": 0.9,
        "allow_rate": 1 / 6,
        "allowed": 1,
        "error_rate_allowed": 0.0,
    }
    assert by_t[0.7]["error_rate_allowed"] == pytest.approx(1 / 3)
    assert by_t[0.6]["allow_rate"] == pytest.approx(4 / 6)
    assert by_t[0.0]["error_rate_allowed"] == pytest.approx(0.5)
    assert max(by_t) == 0.9  # thresholds above every confidence allow nothing: not plotted


def test_without_a_certificate_there_is_no_certified_risk() -> None:
    report = build_report(six_rows())
    assert report["certified_risk"] is None
    assert report["certified_allow"]["within_certified_risk"] is None


def test_a_violated_certificate_is_reported_outside() -> None:
    rows = certified(six_rows(), risk=0.01)
    wrong = [
        Replayed({**r.row, "correct": False}, r.verdict, r.claims)
        if r.verdict["decision"] == "allow"
        else r
        for r in rows
    ]
    cert = build_report(wrong)["certified_allow"]
    assert cert["error_rate_allowed"] == 1.0
    assert cert["within_certified_risk"] is False
