"""Platt and isotonic calibration on synthetic data with known links; the CV choice."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.confidence.calibration import (
    ISOTONIC_CLIP,
    IsotonicCalibrator,
    PlattCalibrator,
    calibrator_from_dict,
    choose_calibrator,
    cross_validated_probabilities,
    fit_isotonic,
    fit_platt,
    stratified_folds,
)
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.stats.metrics import ece

N = 20_000
Sample = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]


def logistic_link(seed: int = 0) -> Sample:
    """s ~ N(0, 1), y ~ Bernoulli(sigmoid(2.5 s - 0.5))."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=N)
    y = (rng.random(N) < 1.0 / (1.0 + np.exp(-(2.5 * s - 0.5)))).astype(np.float64)
    return s, y


def cubic_link(seed: int = 1) -> Sample:
    """s ~ U(0, 1), y ~ Bernoulli(s^3): monotone but not logistic."""
    rng = np.random.default_rng(seed)
    s = rng.random(N)
    return s, (rng.random(N) < s**3).astype(np.float64)


def step_link(seed: int = 2) -> Sample:
    """s ~ U(0, 1), y ~ Bernoulli(0.1 if s < 0.5 else 0.9): a step no sigmoid of s fits."""
    rng = np.random.default_rng(seed)
    s = rng.random(N)
    return s, (rng.random(N) < np.where(s < 0.5, 0.1, 0.9)).astype(np.float64)


def halves(sample: Sample) -> tuple[Sample, Sample]:
    s, y = sample
    return (s[: N // 2], y[: N // 2]), (s[N // 2 :], y[N // 2 :])


def assert_monotone(calibrator: PlattCalibrator | IsotonicCalibrator, lo: float, hi: float) -> None:
    grid = np.linspace(lo, hi, 2001)
    p = calibrator.predict(grid)
    assert np.all(np.diff(p) >= 0.0)
    assert np.all((p >= 0.0) & (p <= 1.0))


def test_platt_recovers_a_logistic_link() -> None:
    (s_fit, y_fit), (s_test, y_test) = halves(logistic_link())
    platt = fit_platt(s_fit, y_fit)
    assert platt.a == pytest.approx(2.5, abs=0.15)
    assert platt.b == pytest.approx(-0.5, abs=0.1)
    assert ece(platt.predict(s_test), y_test) < 0.03
    assert_monotone(platt, -5.0, 5.0)


@pytest.mark.parametrize("sample", [logistic_link, cubic_link, step_link])
def test_isotonic_calibrates_any_monotone_link(sample: Callable[[], Sample]) -> None:
    (s_fit, y_fit), (s_test, y_test) = halves(sample())
    iso = fit_isotonic(s_fit, y_fit)
    assert ece(iso.predict(s_test), y_test) < 0.03
    assert_monotone(iso, float(s_fit.min()) - 1.0, float(s_fit.max()) + 1.0)


def test_choice_follows_the_link() -> None:
    step = step_link()
    calibrator, report = choose_calibrator(*step, folds=5, seed=0)
    assert report.method == "isotonic" == calibrator.method
    assert report.isotonic_cv_nll < report.platt_cv_nll - 0.03
    (s_fit, y_fit), (s_test, y_test) = halves(step)
    chosen, _ = choose_calibrator(s_fit, y_fit)
    assert ece(chosen.predict(s_test), y_test) < 0.03
    assert_monotone(chosen, -1.0, 2.0)
    # On the logistic link the two-parameter model is as good and wins.
    assert choose_calibrator(*logistic_link())[1].method == "platt"


def test_choice_is_deterministic() -> None:
    s, y = cubic_link()
    first = choose_calibrator(s, y, folds=4, seed=7)
    second = choose_calibrator(s, y, folds=4, seed=7)
    assert first == second
    assert first[1].to_dict() == {
        "method": first[1].method,
        "platt_cv_nll": first[1].platt_cv_nll,
        "isotonic_cv_nll": first[1].isotonic_cv_nll,
        "folds": 4,
        "seed": 7,
        "n": N,
    }


def test_out_of_fold_predictions_never_see_their_fold() -> None:
    # Two folds of one point each per class: each prediction comes from the other two points.
    s = np.array([0.0, 1.0, 2.0, 3.0])
    y = np.array([0.0, 1.0, 0.0, 1.0])
    folds = stratified_folds(y, 2, seed=0)
    assert sorted(folds[y == 0].tolist()) == [0, 1] and sorted(folds[y == 1].tolist()) == [0, 1]
    p = cross_validated_probabilities("isotonic", s, y, folds=2, seed=0)
    for i in range(4):
        held = folds == folds[i]
        expected = fit_isotonic(s[~held], y[~held]).predict(s[i : i + 1])[0]
        assert p[i] == expected


def test_isotonic_pools_ties_and_violators() -> None:
    # Distinct scores 0, 1, 2, 3 with means 1, (0 + 1)/2, 0, 1 and weights 1, 2, 1, 1.
    # PAV: [1] + [.5] -> 2/3 (w 3); + [0] -> 2/4 = .5 (w 4); [1] stays.
    # Blocks: scores 0..2 -> .5, score 3 -> 1.
    iso = fit_isotonic([0, 1, 1, 2, 3], [1, 0, 1, 0, 1])
    assert iso.x == (0.0, 2.0, 3.0)
    assert iso.y == (0.5, 0.5, 1.0)
    # Linear between blocks, flat and clipped beyond the ends.
    assert iso.predict([2.5, -10.0, 10.0]).tolist() == pytest.approx(
        [0.75, 0.5, 1.0 - ISOTONIC_CLIP]
    )


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-5, 5), st.booleans()), min_size=1, max_size=40),
)
def test_isotonic_is_monotone_and_keeps_the_total(points: list[tuple[int, bool]]) -> None:
    s = np.array([float(x) for x, _ in points])
    y = np.array([float(v) for _, v in points])
    iso = fit_isotonic(s, y)
    fitted = iso.predict(s)
    assert_monotone(iso, -6.0, 6.0)
    # PAV block means preserve the label total (up to the [1e-4, 1 - 1e-4] clip).
    assert abs(fitted.sum() - y.sum()) <= len(points) * ISOTONIC_CLIP + 1e-9


def test_platt_on_separable_and_degenerate_data() -> None:
    separable = fit_platt([0.0, 1.0, 2.0, 3.0], [0, 0, 1, 1])
    assert 0.0 < separable.a < 10.0  # finite thanks to the smoothed targets
    assert separable.predict([0.0])[0] < 0.5 < separable.predict([3.0])[0]
    reversed_ = fit_platt([3.0, 2.0, 1.0, 0.0], [0, 0, 1, 1])
    assert reversed_.a == 0.0  # a decreasing fit is replaced by the best constant
    constant = fit_platt([1.0, 1.0, 1.0], [0, 1, 1])
    # targets: 1/(1 + 2) for the negative, (2 + 1)/(2 + 2) for the two positives.
    mean_target = (1 / 3 + 2 * 0.75) / 3
    assert constant.a == 0.0
    assert constant.predict([5.0])[0] == pytest.approx(mean_target)


def test_json_round_trip() -> None:
    s, y = step_link()
    for calibrator in (fit_platt(s, y), fit_isotonic(s, y)):
        data = json.loads(json.dumps(calibrator.to_dict()))
        rebuilt = calibrator_from_dict(data)
        assert rebuilt == calibrator
        grid = np.linspace(-1.0, 2.0, 301)
        assert np.array_equal(rebuilt.predict(grid), calibrator.predict(grid))


@pytest.mark.parametrize(
    "data",
    [
        {"method": "temperature", "t": 1.0},
        {"method": "platt", "a": 1.0},
        {"method": "platt", "a": -1.0, "b": 0.0},
        {"method": "platt", "a": "1", "b": 0.0},
        {"method": "isotonic", "x": [0.0, 0.0], "y": [0.1, 0.2]},
        {"method": "isotonic", "x": [0.0, 1.0], "y": [0.3, 0.2]},
        {"method": "isotonic", "x": [0.0], "y": [1.5]},
        {"method": "isotonic", "x": "0", "y": [0.5]},
    ],
)
def test_malformed_calibrators(data: dict[str, object]) -> None:
    with pytest.raises(ArtifactError):
        calibrator_from_dict(data)


def test_bad_arguments() -> None:
    with pytest.raises(ConfidenceDataError, match="lengths must match"):
        fit_platt([0.1, 0.2], [1])
    with pytest.raises(ConfidenceDataError, match="finite"):
        fit_isotonic([0.1, np.inf], [1, 0])
    with pytest.raises(ConfigError, match="folds"):
        choose_calibrator([0.1, 0.2, 0.3], [0, 1, 1], folds=1)
    with pytest.raises(ConfidenceDataError, match="needs >= 5 items"):
        choose_calibrator([0.1, 0.2, 0.3], [0, 1, 1])
