"""Statistical validity of the certificate (seed 000, eq. 3) and the monitor's alarm.

Coverage over random calibration / test splits
----------------------------------------------
Each trial draws a fresh synthetic data set (``synthetic``: one correct chunk per
question, continuous i.i.d. scores, so the correct chunks are exchangeable and
tie-free), splits its questions at random into ``n`` calibration and ``m`` test
questions, calibrates and measures the coverage ``cov`` = share of the test's
correct chunks that are trusted. Split conformal theory gives, for continuous
scores, the conditional coverage ``C ~ Beta(k, n + 1 - k)`` with
``k = ceil((n+1)(1-alpha))``, so ``E[cov] = k / (n+1)``, which lies in
``[1 - alpha, 1 - alpha + 1/(n+1))`` (eq. 3). Given C, ``cov`` is a mean of ``m``
independent Bernoulli(C), so

    Var(cov) = Var(C) + E[C(1 - C)] / m
             <= k(n+1-k) / ((n+1)^2 (n+2)) + alpha(1 - alpha) / m,

using Jensen (E[C(1-C)] <= E[C](1-E[C])) and E[C] >= 1 - alpha >= 1/2. The mean of
R independent trials then has standard deviation at most sigma = sqrt(Var / R),
and we accept ``1 - alpha - z*sigma <= mean <= 1 - alpha + 1/(n+1) + z*sigma`` with
z = 4 (a false failure about once in 16 000 runs). Nothing here is tuned: the
bound follows from n, m, R and alpha. ``test_the_band_detects_an_off_by_one_rank``
shows the band is narrow enough to catch a rank that is off by two.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sidecar.conformal.calibrator import RetrievalCalibrator, evaluate
from sidecar.conformal.certify import certify
from sidecar.conformal.monitor import ExchangeabilityMonitor, MonitorState
from sidecar.conformal.quantile import order_statistic_rank
from tests.conformal.conftest import Retrievals, synthetic

N_CAL = 200
N_TEST = 200
TRIALS = 1000
Z = 4.0


def _band(
    alpha: float, n: int = N_CAL, m: int = N_TEST, trials: int = TRIALS
) -> tuple[float, float]:
    k = order_statistic_rank(n, alpha)
    var = k * (n + 1 - k) / ((n + 1) ** 2 * (n + 2)) + alpha * (1 - alpha) / m
    tol = Z * math.sqrt(var / trials)
    return 1 - alpha - tol, 1 - alpha + 1 / (n + 1) + tol


def _split(rng: np.random.Generator) -> tuple[Retrievals, Retrievals]:
    data = synthetic(rng, N_CAL + N_TEST)
    order = rng.permutation(N_CAL + N_TEST)
    return data.take(order[:N_CAL]), data.take(order[N_CAL:])


def _coverage_trials(alpha: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty(TRIALS)
    for t in range(TRIALS):
        cal, test = _split(rng)
        c = RetrievalCalibrator(alpha).fit(cal.scores).calibrate(cal.scores, cal.labels)
        cov = evaluate(c.calibration_, test.scores, test.labels).coverage
        assert cov is not None
        out[t] = cov
    return out


@pytest.mark.parametrize(("alpha", "seed"), [(0.1, 101), (0.2, 202), (0.05, 303)])
def test_mean_coverage_lies_in_the_conformal_band(alpha: float, seed: int) -> None:
    covs = _coverage_trials(alpha, seed)
    lo, hi = _band(alpha)
    assert lo <= covs.mean() <= hi, (covs.mean(), lo, hi)


def test_the_band_detects_an_off_by_one_rank() -> None:
    """Power check: cutting at the (k-2)-th largest correct score, E[cov] = (k-2)/(n+1), fails."""
    alpha = 0.1
    k = order_statistic_rank(N_CAL, alpha)
    rng = np.random.default_rng(404)
    covs = []
    for _ in range(TRIALS):
        cal, test = _split(rng)
        cal_correct = np.array([s for row, y in zip(cal.scores, cal.labels, strict=True)
                                for s, c in zip(row, y, strict=True) if c])  # fmt: skip
        test_correct = np.array([s for row, y in zip(test.scores, test.labels, strict=True)
                                 for s, c in zip(row, y, strict=True) if c])  # fmt: skip
        wrong_cut = np.sort(cal_correct)[::-1][k - 3]  # the (k-2)-th largest instead of k-th
        covs.append(float(np.mean(test_correct >= wrong_cut)))
    lo, _ = _band(alpha)
    assert np.mean(covs) < lo  # E = (k-2)/(n+1) = 179/201 = 0.8905 < 0.9 - tol


def test_certify_matches_the_batch_coverage_on_one_split() -> None:
    rng = np.random.default_rng(505)
    cal, test = _split(rng)
    c = RetrievalCalibrator(0.1).fit(cal.scores).calibrate(cal.scores, cal.labels).calibration_
    trusted_correct = sum(
        sum(1 for j in certify(row, c).trusted_indices if y[j])
        for row, y in zip(test.scores, test.labels, strict=True)
    )
    m = evaluate(c, test.scores, test.labels)
    assert trusted_correct == m.n_correct_trusted


def _stream(rng: np.random.Generator, n: int, *, miss_rate: float) -> list[list[float]]:
    """Test retrievals; with ``miss_rate`` the correct chunk is not in the top K at all."""
    data = synthetic(rng, n)
    rows = []
    for scores, labels in zip(data.scores, data.labels, strict=True):
        row = scores
        if rng.random() < miss_rate:
            # the retriever ranked a wrong chunk in place of the correct one
            row = [
                s if not y else float(rng.normal(0.4, 0.1))
                for s, y in zip(scores, labels, strict=True)
            ]
        rows.append(row)
    return rows


def test_monitor_stays_quiet_under_exchangeability() -> None:
    rng = np.random.default_rng(606)
    cal = synthetic(rng, 1000)
    c = RetrievalCalibrator(0.1).fit(cal.scores).calibrate(cal.scores, cal.labels).calibration_
    mon = ExchangeabilityMonitor(window=500, confidence=0.999, min_samples=100)
    states = [mon.observe(certify(row, c)).state for row in _stream(rng, 3000, miss_rate=0.0)]
    assert MonitorState.BROKEN not in states
    assert states[-1] is MonitorState.OK


def test_monitor_fires_when_the_retriever_misses_correct_chunks() -> None:
    """Seed Sec. 4.2: correct chunks absent from the top K break exchangeability."""
    rng = np.random.default_rng(707)
    cal = synthetic(rng, 1000)
    c = RetrievalCalibrator(0.1).fit(cal.scores).calibrate(cal.scores, cal.labels).calibration_
    mon = ExchangeabilityMonitor(window=500, confidence=0.999, min_samples=100)
    healthy = [mon.observe(certify(row, c)) for row in _stream(rng, 600, miss_rate=0.0)]
    assert healthy[-1].state is MonitorState.OK
    drifted = [mon.observe(certify(row, c)) for row in _stream(rng, 1500, miss_rate=0.4)]
    assert drifted[-1].state is MonitorState.BROKEN
    assert drifted[-1].interval.high < 0.9
    edges = [s for s in drifted if s.changed]
    assert [s.state for s in edges] == [MonitorState.BROKEN]
    assert "recalibrate" in edges[0].message
