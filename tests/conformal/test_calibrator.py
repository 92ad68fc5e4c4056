"""fit -> calibrate -> predict on toy data worked by hand (seed 000, eqs. 2-6)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from sidecar.conformal.calibrator import (
    ConformalCalibration,
    RetrievalCalibrator,
    alpha_sweep,
    evaluate,
)
from sidecar.exceptions import ConfigError, InputError, LifecycleError
from tests.conformal.conftest import SyntheticFactory

# raw = 2 + 4 * normalised, so n1 = 2, n2 = 6 and the normalised values are exact
NORMALISED = [[1.0, 0.5, 0.125], [0.75, 0.25], [0.875, 0.625, 0.0]]
RAW = [[2.0 + 4.0 * v for v in row] for row in NORMALISED]
LABELS = [[True, False, False], [True, False], [False, True, False]]
# correct chunks: normalised 1.0, 0.75, 0.625 -> nonconformity 0, 0.25, 0.375; n = 3


def _cal(alpha: float) -> RetrievalCalibrator:
    return RetrievalCalibrator(alpha).fit(RAW).calibrate(RAW, LABELS)


def test_toy_calibration_by_hand() -> None:
    c = _cal(0.5).calibration_  # k = ceil(4 * 0.5) = 2
    assert (c.n1, c.n2, c.n, c.k) == (2.0, 6.0, 3, 2)
    assert (c.q_hat, c.threshold) == (0.25, 0.75)
    assert (c.n_questions, c.n_chunks) == (3, 8)
    assert c.certifiable
    assert c.coverage_bounds == (0.5, 0.75)

    c = _cal(0.25).calibration_  # k = ceil(4 * 0.75) = 3
    assert (c.k, c.q_hat, c.threshold) == (3, 0.375, 0.625)


def test_too_few_correct_chunks_is_vacuous_not_an_error() -> None:
    c = _cal(0.2).calibration_  # k = ceil(4 * 0.8) = 4 > n = 3
    assert (c.k, c.n) == (4, 3)
    assert not c.certifiable
    assert c.q_hat == math.inf
    assert c.threshold == -math.inf
    assert "nothing can be certified at alpha=0.2" in c.explain()


def test_predict_uses_the_threshold_inclusively_and_clips() -> None:
    cal = _cal(0.5)  # threshold 0.75 on the normalised scale, i.e. raw 5.0
    assert cal.predict([5.0, 3.0]).tolist() == [True, False]
    assert cal.predict([7.0, 1.0]).tolist() == [True, False]  # clipped to 1 and 0
    assert cal.predict([4.999]).tolist() == [False]


def test_evaluate_by_hand() -> None:
    m = evaluate(_cal(0.5).calibration_, RAW, LABELS)
    # trusted per row: {0}, {0}, {0}; correct (2, 1) at 0.625 < 0.75 is missed
    assert (m.n_correct, m.n_correct_trusted) == (3, 2)
    assert m.coverage == pytest.approx(2 / 3)
    assert m.m1_mean == 1.0
    assert m.m2_mean == pytest.approx((1 / 3 + 1 / 2 + 1 / 3) / 3)
    m = evaluate(_cal(0.25).calibration_, RAW, LABELS)
    assert m.coverage == 1.0
    assert m.m2_mean == pytest.approx((1 / 3 + 1 / 2 + 2 / 3) / 3)
    m = evaluate(_cal(0.25).calibration_, [[1.0], []])
    assert m.coverage is None
    assert (m.m1_mean, m.m2_mean, m.n_clipped) == (0.0, 0.0, 1)


def test_calibration_set_coverage_is_at_least_k_over_n(make_retrievals: SyntheticFactory) -> None:
    data = make_retrievals(seed=3, n_questions=150, correct_per_question=2)
    for alpha in (0.05, 0.1, 0.3, 0.6):
        c = RetrievalCalibrator(alpha).fit(data.scores).calibrate(data.scores, data.labels)
        m = evaluate(c.calibration_, data.scores, data.labels)
        # at least the k largest correct scores are >= the k-th largest one
        assert m.n_correct_trusted >= c.calibration_.k
        assert m.coverage is not None
        assert m.coverage >= 1 - alpha


def test_lifecycle_guards() -> None:
    cal = RetrievalCalibrator(0.1)
    with pytest.raises(LifecycleError, match=r"fit\(scores\)"):
        cal.predict([0.5])
    with pytest.raises(LifecycleError, match=r"fit\(scores\)"):
        cal.calibrate(RAW, LABELS)
    cal.fit(RAW)
    with pytest.raises(LifecycleError, match=r"calibrate\(scores, labels\)"):
        cal.predict([0.5])
    cal.calibrate(RAW, LABELS)
    assert cal.predict([6.0]).tolist() == [True]
    cal.fit(RAW)  # re-fitting invalidates the calibration
    with pytest.raises(LifecycleError):
        _ = cal.calibration_


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        RetrievalCalibrator(0.0)
    with pytest.raises(InputError) as info:
        RetrievalCalibrator(0.1).fit([[0.1, math.nan]])
    assert info.value.reason == "invalid-score"
    with pytest.raises(InputError) as info:
        RetrievalCalibrator(0.1).fit(RAW).calibrate(RAW, [[True], [True, False], [False] * 3])
    assert info.value.reason == "shape-mismatch"


@pytest.mark.parametrize(
    "scores", [[["0.9", "0.5"]], [[0.9, True]], [[b"0.9"]]], ids=["text", "flag", "bytes"]
)
def test_scores_that_numpy_would_convert_are_refused(scores: list[list[object]]) -> None:
    """numpy reads "0.9" as 0.9 and True as 1.0: the audit's quoted scores calibrated."""
    with pytest.raises(InputError, match="scores must be numbers") as info:
        RetrievalCalibrator(0.1).fit(scores)  # type: ignore[arg-type]
    assert info.value.reason == "invalid-score"


@pytest.mark.parametrize(
    "labels",
    [
        [["yes", "no", "no"], ["no", "no"], ["no", "yes", "no"]],  # bool("no") is True
        [[1.0, 0.0, 0.0], [1.0, 0.0], [0.0, 1.0, 0.0]],
        [[2, 0, 0], [1, 0], [0, 1, 0]],
    ],
    ids=["text", "floats", "counts"],
)
def test_labels_that_are_not_true_false_are_refused(labels: list[list[object]]) -> None:
    """Audit: labels "no" read as True moved n from 40 to 200 and q_hat from 0.11 to 0.94."""
    with pytest.raises(InputError, match="labels must be true/false") as info:
        RetrievalCalibrator(0.1).fit(RAW).calibrate(RAW, labels)  # type: ignore[arg-type]
    assert info.value.reason == "invalid-label"


def test_labels_may_be_ones_and_zeros() -> None:
    ints = [[int(v) for v in row] for row in LABELS]
    got = RetrievalCalibrator(0.5).fit(RAW).calibrate(RAW, ints).calibration_  # type: ignore[arg-type]
    assert got == _cal(0.5).calibration_


def test_calibration_invariants_are_checked() -> None:
    good = _cal(0.5).calibration_
    with pytest.raises(ConfigError, match="k must be"):
        ConformalCalibration(
            alpha=good.alpha, n1=2.0, n2=6.0, n=3, k=3, q_hat=0.25, threshold=0.75,
            n_questions=3, n_chunks=8,
        )  # fmt: skip
    with pytest.raises(ConfigError, match="must be \\+inf"):
        ConformalCalibration(
            alpha=Fraction(1, 5), n1=2.0, n2=6.0, n=3, k=4, q_hat=0.3, threshold=0.7,
            n_questions=3, n_chunks=8,
        )  # fmt: skip


def test_sweep_matches_the_calibrator_at_every_alpha(make_retrievals: SyntheticFactory) -> None:
    cal = make_retrievals(seed=1, n_questions=80)
    test = make_retrievals(seed=2, n_questions=60)
    alphas = [Fraction(1, 100), Fraction(1, 10), Fraction(1, 4), Fraction(9, 10)]
    points = alpha_sweep(cal.scores, cal.labels, alphas, test.scores, test.labels)
    for alpha, point in zip(alphas, points, strict=True):
        c = RetrievalCalibrator(alpha).fit(cal.scores).calibrate(cal.scores, cal.labels)
        m = evaluate(c.calibration_, test.scores, test.labels)
        assert (point.alpha, point.k, point.q_hat) == (
            alpha,
            c.calibration_.k,
            c.calibration_.q_hat,
        )
        assert (point.m1_mean, point.m2_mean, point.coverage) == (m.m1_mean, m.m2_mean, m.coverage)
    # alpha = 0.01 with n = 80: k = ceil(81 * 0.99) = 81 > 80 -> everything trusted
    assert points[0].q_hat == math.inf
    assert (points[0].m1_mean, points[0].m2_mean) == (1.0, 1.0)
    m1 = [p.m1_mean for p in points]
    assert m1 == sorted(m1, reverse=True)


def test_sweep_defaults_to_the_calibration_set(make_retrievals: SyntheticFactory) -> None:
    cal = make_retrievals(seed=4, n_questions=50)
    own = alpha_sweep(cal.scores, cal.labels, [0.2])
    explicit = alpha_sweep(cal.scores, cal.labels, [0.2], cal.scores, cal.labels)
    assert own == explicit
    assert np.isfinite(own[0].q_hat)


def test_coverage_spread_is_where_the_coverage_of_simulated_calibrations_falls() -> None:
    """Across calibration sets of n scores, the coverage of the threshold is Beta(k, n+1-k):
    with uniform nonconformity it is q_hat itself. 4,000 simulated sets of n = 50."""
    n, alpha = 50, 0.1
    k = math.ceil((n + 1) * (1 - alpha))
    cal = ConformalCalibration(
        alpha=Fraction(1, 10), n1=0.0, n2=1.0, n=n, k=k, q_hat=0.5, threshold=0.5,
        n_questions=n, n_chunks=n,
    )  # fmt: skip
    spread = cal.coverage_spread(0.9)
    assert spread is not None
    low, high = spread
    rng = np.random.default_rng(7)
    coverages = np.sort(rng.random((4000, n)), axis=1)[:, k - 1]  # the k-th smallest
    inside = float(np.mean((coverages >= low) & (coverages <= high)))
    assert abs(inside - 0.9) < 0.02, inside  # 3 standard errors of a share of 4,000
    assert float(np.mean(coverages)) == pytest.approx(k / (n + 1), abs=0.005)  # eq. (3) mean
    assert low < 1 - alpha < high


def test_a_vacuous_calibration_has_no_coverage_spread() -> None:
    assert _cal(0.2).calibration_.coverage_spread() is None


def test_beta_quantile_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    from sidecar.stats.binomial import beta_quantile

    for a, b, q in [(1494, 166, 0.05), (9, 1, 0.05), (90, 11, 0.95), (3, 7, 0.5), (1, 1, 0.3)]:
        assert beta_quantile(a, b, q) == pytest.approx(stats.beta.ppf(q, a, b), abs=1e-9)
    with pytest.raises(ConfigError):
        beta_quantile(0, 3, 0.5)
    with pytest.raises(ConfigError):
        beta_quantile(2, 3, 1.0)


def test_distances_are_refused_at_calibration(make_retrievals: SyntheticFactory) -> None:
    """Audit: distances (1 - cosine) calibrated without a word; served, they trust the worst."""
    data = make_retrievals(seed=3, n_questions=60)
    RetrievalCalibrator(0.1).fit(data.scores).calibrate(data.scores, data.labels)
    distances = [[1.0 - s for s in row] for row in data.scores]
    with pytest.raises(InputError, match="look like distances") as info:
        RetrievalCalibrator(0.1).fit(distances).calibrate(distances, data.labels)
    assert info.value.reason == "score-direction"


def test_a_few_lists_of_distances_are_refused_by_their_order() -> None:
    """Audit: 18 lists of 1 - similarity, too few for the label check (20 of each kind),
    were calibrated; served, lists like them are refused as rising (ScoreOrder)."""
    rng = np.random.default_rng(5)
    similarities = [sorted(rng.uniform(0.2, 0.9, 5).tolist(), reverse=True) for _ in range(18)]
    labels = [[True, False, False, False, False] for _ in similarities]
    RetrievalCalibrator(0.2).fit(similarities).calibrate(similarities, labels)  # best first
    distances = [[1.0 - s for s in row] for row in similarities]  # still best first: rising
    with pytest.raises(InputError, match="rise down the hit list in 18 of 18") as info:
        RetrievalCalibrator(0.2).fit(distances).calibrate(distances, labels)
    assert info.value.reason == "score-direction"


# ten questions, one correct chunk each: n = 10, k = ceil(11 * 0.9) = 10 = n, so the cut is
# the smallest correct score, which is also n1: the threshold is 0 on the normalised scale
ALL_CORRECT = [[float(v)] for v in range(1, 11)]
ALL_CORRECT_LABELS = [[True]] * 10
BELOW_N1 = 0.5  # raw, below n1 = 1: its normalised score is -1/18 < 0 = 1 - q_hat


def test_a_score_below_the_calibrated_range_fails_a_zero_threshold() -> None:
    """Eq. 4 trusts s' >= 1 - q_hat; a score below n1 has s' < 0 and fails a cut at 0.
    Clipping it to 0 first trusted it (audit: with k = n the coverage of correct chunks
    was 1.0 for every calibration, not k/(n+1) = 0.909, above eq. 3's upper bound)."""
    fitted = RetrievalCalibrator(0.1).fit(ALL_CORRECT).calibrate(ALL_CORRECT, ALL_CORRECT_LABELS)
    cal = fitted.calibration_
    assert (cal.n, cal.k, cal.threshold) == (10, 10, 0.0)
    assert fitted.predict([5.0, 1.0, BELOW_N1]).tolist() == [True, True, False]
    metrics = evaluate(cal, [[5.0, 1.0, BELOW_N1]], [[True, True, True]])
    assert metrics.coverage == pytest.approx(2 / 3)
    assert metrics.m2_mean == pytest.approx(2 / 3)
    assert metrics.n_clipped == 1  # still counted as clipped
    (point,) = alpha_sweep(
        ALL_CORRECT, ALL_CORRECT_LABELS, [0.1], [[5.0, 1.0, BELOW_N1]], [[True, True, True]]
    )
    assert point.coverage == pytest.approx(2 / 3)
