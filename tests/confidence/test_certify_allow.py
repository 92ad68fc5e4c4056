"""Certified allow: Learn-then-Test on the calibrated confidence, the certificate, the re-test.

The statistical test draws 1,000 calibration sets (n = 400; risk 0.3, delta
0.1) from a model whose confidence-error link is known (confidence ~ Beta(2, 3),
P(correct | c) = c, so the error among answers allowed at t is r(t) = 1 - E[C | C >= t], computed
exactly), certifies each, and counts the draws whose certified threshold has
r(t*) > risk. Learn then Test promises that share is <= delta.

Tolerance: the procedure is deterministic given the seed, so the test cannot
flake; the margin says how unlikely a *correct* procedure is to fail it. If the
true violation probability were exactly delta = 0.1, the count over 1,000
independent draws is Binomial(1000, 0.1); its 0.999 quantile is 130, so a
correct procedure passes ``violations <= 130`` with probability >= 0.999 over
seeds (fixed-sequence testing is conservative, so the true rate is below delta
and the margin is larger still). The control arm (the naive rule "lowest
threshold whose empirical error <= risk") violates far more often, which shows
the test can fail.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt
import pytest

from sidecar.confidence.certificate_check import CertificateTracker
from sidecar.confidence.certify_allow import (
    DEFAULT_GRID,
    START_SHARE,
    AllowCertificate,
    learn_then_test,
    min_testable,
    smallest_certifiable_risk,
    start_size,
)
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.exceptions import ConfigError
from sidecar.stats.binomial import binomial_cdf, clopper_pearson

RISK, DELTA, N, DRAWS = 0.2, 0.1, 400, 1000
SIM_RISK = 0.3  # r(t) crosses 0.3 at t = 0.6, where ~18 % of answers are allowed


def _beta23_error_rate(t: float) -> float:
    """r(t) = 1 - E[C | C >= t] for C ~ Beta(2, 3): density 12 c (1 - c)^2, exact polynomials."""

    def mass(x: float) -> float:  # integral_0^x 12 c (1-c)^2 dc
        return 6 * x**2 - 8 * x**3 + 3 * x**4

    def first_moment(x: float) -> float:  # integral_0^x 12 c^2 (1-c)^2 dc
        return 4 * x**3 - 6 * x**4 + 2.4 * x**5

    tail = 1.0 - mass(t)
    return 1.0 - (first_moment(1.0) - first_moment(t)) / tail


def _draw(rng: np.random.Generator, n: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int_]]:
    conf = rng.beta(2.0, 3.0, size=n)
    correct = (rng.random(n) < conf).astype(int)
    return conf, correct


def _naive_threshold(
    conf: npt.NDArray[np.float64], correct: npt.NDArray[np.int_], risk: float
) -> float | None:
    """The lowest grid threshold whose empirical error among allowed is <= risk (no test)."""
    chosen = None
    for t in DEFAULT_GRID:
        allowed = conf >= t
        if allowed.any() and 1.0 - correct[allowed].mean() <= risk:
            chosen = t
    return chosen


def test_the_exact_error_curve_is_right() -> None:
    rng = np.random.default_rng(7)
    conf = rng.beta(2.0, 3.0, size=2_000_000)
    for t in (0.0, 0.5, 0.8):
        empirical = 1.0 - conf[conf >= t].mean()
        assert _beta23_error_rate(t) == pytest.approx(empirical, abs=2e-3)
    assert _beta23_error_rate(0.0) == pytest.approx(0.6, abs=1e-12)


def test_certified_threshold_keeps_the_error_among_allowed_below_risk_in_1000_draws() -> None:
    rng = np.random.default_rng(20260301)
    violations = naive_violations = certified = 0
    for _ in range(DRAWS):
        conf, correct = _draw(rng, N)
        result = learn_then_test(conf, correct, risk=SIM_RISK, delta=DELTA)
        if result.threshold is not None:
            certified += 1
            violations += _beta23_error_rate(result.threshold) > SIM_RISK
        naive = _naive_threshold(conf, correct, SIM_RISK)
        if naive is not None:
            naive_violations += _beta23_error_rate(naive) > SIM_RISK
    # the 0.999 quantile of Binomial(1000, 0.1), see the module docstring
    limit = next(k for k in range(DRAWS) if binomial_cdf(k, DRAWS, DELTA) >= 0.999)
    assert limit == 130
    assert violations <= limit
    # not vacuous: with 400 labels and this link it certifies in about 4 draws of 10
    assert certified >= 0.25 * DRAWS
    print(f"violations {violations}, certified {certified}, naive {naive_violations}")
    assert naive_violations > 2 * limit  # the test can fail: skipping the test does


def test_walk_never_tests_past_the_first_failure() -> None:
    # 30 answers at 0.95 all right; 30 at 0.85 all wrong; 400 at 0.5 all right.
    # At 0.85 the error is 0.5 > risk (fails); at 0.5 it would be 30/460 and pass.
    conf = np.array([0.95] * 30 + [0.85] * 30 + [0.5] * 400)
    correct = np.array([1] * 30 + [0] * 30 + [1] * 400)
    result = learn_then_test(conf, correct, risk=RISK, delta=DELTA)
    assert result.threshold == pytest.approx(0.86)  # the last grid point above 0.85
    assert result.stopped_at == pytest.approx(0.85)
    assert result.steps[-1].outcome == "failed"
    assert all(s.threshold >= 0.85 for s in result.steps)
    assert not any(s.threshold <= 0.5 for s in result.steps)
    # the same data without the bad middle block certifies all the way down
    keep = conf != 0.85
    lower = learn_then_test(conf[keep], correct[keep], risk=RISK, delta=DELTA)
    assert lower.threshold == pytest.approx(0.0)


def test_untestable_prefix_is_skipped_not_failed() -> None:
    need = min_testable(RISK, DELTA)
    assert (1 - RISK) ** need <= DELTA < (1 - RISK) ** (need - 1)
    start = start_size(RISK, DELTA)
    assert start >= need
    # rejecting at half the risk: floor(start * risk / 2) errors pass, one size less does not
    assert binomial_cdf(math.floor(start * RISK / 2), start, RISK) <= DELTA
    assert binomial_cdf(math.floor((start - 1) * RISK / 2), start - 1, RISK) > DELTA
    # two wrong answers at the very top do not end the walk: they are below the start size
    conf = np.array([0.97] * 2 + [0.6] * 400)
    correct = np.array([0] * 2 + [1] * 400)
    result = learn_then_test(conf, correct, risk=RISK, delta=DELTA)
    untestable = [s for s in result.steps if s.outcome == "untestable"]
    first = next(s for s in result.steps if s.outcome != "untestable")
    assert untestable and all(s.allowed <= 2 for s in untestable)
    assert first.allowed >= max(start, math.ceil(START_SHARE * conf.size))
    assert result.threshold == pytest.approx(0.0)
    # the same two answers tested first (a start of 1) end the walk at once
    strict = learn_then_test(conf, correct, risk=RISK, delta=DELTA, min_allowed=1)
    assert not strict.certified and strict.tested == 1


def test_nothing_certifiable_reports_the_smallest_certifiable_risk() -> None:
    rng = np.random.default_rng(3)
    conf, correct = _draw(rng, N)
    result = learn_then_test(conf, correct, risk=0.02, delta=DELTA)
    assert not result.certified
    smallest = smallest_certifiable_risk(conf, correct, delta=DELTA)
    assert smallest is not None and 0.02 < smallest < 0.6
    assert learn_then_test(conf, correct, risk=smallest, delta=DELTA).certified
    assert not learn_then_test(conf, correct, risk=smallest - 0.005, delta=DELTA).certified


def test_p_values_are_exact_binomial_tails() -> None:
    conf = np.array([0.9] * 50 + [0.1] * 50)
    correct = np.array([1] * 45 + [0] * 5 + [0] * 50)
    result = learn_then_test(conf, correct, risk=RISK, delta=DELTA)
    step = next(s for s in result.steps if s.threshold == pytest.approx(0.9))
    expected = sum(math.comb(50, k) * RISK**k * (1 - RISK) ** (50 - k) for k in range(6))
    assert step.p_value == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"risk": 0.0, "delta": 0.1}, "risk must be in"),
        ({"risk": 0.2, "delta": 1.0}, "delta must be in"),
        ({"risk": 0.2, "delta": 0.1, "grid": [0.1, 0.5]}, "strictly decreasing"),
    ],
)
def test_bad_settings_fail_fast(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        learn_then_test([0.5], [1], **kwargs)  # type: ignore[arg-type]


def test_bad_data_is_a_data_error() -> None:
    with pytest.raises(ConfidenceDataError, match="finite probabilities"):
        learn_then_test([1.5], [1], risk=RISK, delta=DELTA)
    with pytest.raises(ConfidenceDataError, match="0/1"):
        learn_then_test([0.5], [2], risk=RISK, delta=DELTA)


def test_clopper_pearson_inverts_the_binomial_tails() -> None:
    for k, n in ((0, 10), (3, 10), (10, 10), (17, 400)):
        low, high = clopper_pearson(k, n, 0.95)
        if k < n:  # P(X <= k | high) = 0.025
            assert binomial_cdf(k, n, high) == pytest.approx(0.025, abs=1e-9)
        else:
            assert high == 1.0
        if k > 0:  # P(X >= k | low) = 0.025
            assert 1.0 - binomial_cdf(k - 1, n, low) == pytest.approx(0.025, abs=1e-9)
        else:
            assert low == 0.0
    # closed form for no successes: high = 1 - 0.025^(1/n)
    assert clopper_pearson(0, 10, 0.95)[1] == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-12)


def test_certificate_records_what_was_certified() -> None:
    conf = np.array([0.9] * 100 + [0.3] * 300)
    correct = np.array([1] * 95 + [0] * 5 + [1] * 100 + [0] * 200)
    result = learn_then_test(conf, correct, risk=RISK, delta=DELTA)
    cert = AllowCertificate.from_result(
        result,
        key="default/nq-open/qdrant-minilm-l6",
        smallest_risk=None,
        grid=DEFAULT_GRID,
        data_hash="0" * 64,
        confidence_model="confidence@x",
        created_at=datetime(2026, 3, 1, tzinfo=UTC),
    )
    assert cert.threshold == result.threshold
    chosen = result.chosen
    assert chosen is not None
    assert cert.allowed == int((conf >= chosen.threshold).sum())
    assert (cert.allowed, cert.errors_allowed) == (100, 5)
    assert cert.threshold == pytest.approx(0.31)
    assert cert.allow_rate == pytest.approx(0.25)
    assert "allow when confidence >=" in cert.summary()


# ------------------------------------------------------------------ online re-test


def test_tracker_flags_a_certificate_that_no_longer_holds() -> None:
    tracker = CertificateTracker(window=100, confidence=0.95)
    tracker.register("k", RISK, DELTA)
    assert tracker.check("k").status == "insufficient-data"
    for i in range(60):
        tracker.observe_label("k", f"r{i}", wrong=i % 10 == 0)  # 10 % wrong
    check = tracker.check("k")
    assert check.status == "holds" and not tracker.violated("k")
    assert check.error_high is not None and check.error_high < 0.25
    for i in range(60, 160):
        tracker.observe_label("k", f"r{i}", wrong=i % 2 == 0)  # 50 % wrong, window 100
    check = tracker.check("k")
    assert check.labelled == 100
    assert check.status == "violated" and tracker.violated("k")
    assert check.error_low is not None and check.error_low > RISK


def test_tracker_last_label_wins_and_unknown_keys_are_ignored() -> None:
    tracker = CertificateTracker(window=10)
    tracker.register("k", RISK, DELTA)
    assert tracker.observe_label("k", "a", wrong=True) is False
    assert tracker.observe_label("k", "a", wrong=False) is True
    assert tracker.check("k").errors == 0
    assert tracker.observe_label("other", "a", wrong=True) is False
    with pytest.raises(ConfigError, match="one key has one certificate"):
        tracker.register("k", 0.3, DELTA)


def test_tracker_status_agrees_with_the_interval_and_is_fast_on_a_full_window() -> None:
    import time

    tracker = CertificateTracker(window=10_000, confidence=0.95)
    tracker.register("k", RISK, DELTA)
    rng = np.random.default_rng(5)
    for i, wrong in enumerate(rng.random(10_000) < 0.21):
        tracker.observe_label("k", f"r{i}", wrong=bool(wrong))
        if i % 997 == 0:  # the cheap one-tail status is the interval's verdict
            check = tracker.check("k")
            assert check.error_low is not None
            assert (check.status == "violated") == (check.error_low > RISK)
    started = time.perf_counter()
    for i in range(100):
        tracker.observe_label("k", f"late{i}", wrong=i % 3 == 0)
    per_label_ms = (time.perf_counter() - started) * 1000 / 100
    assert per_label_ms < 20  # one vectorised binomial tail per label, not an interval
    check = tracker.check("k")
    assert check.labelled == 10_000
    assert check.status == ("violated" if check.error_low and check.error_low > RISK else "holds")
