"""The coverage bound H <= c eps + (1 - c) delta (seed 003) and its rolling tracker."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sidecar.confidence.bound import CoverageCounts, CoverageTracker, coverage_bound
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.exceptions import ConfigError
from sidecar.stats.intervals import wilson_interval


def test_bound_by_hand() -> None:
    counts = CoverageCounts(
        requests=1000,
        covered=800,
        labelled_covered=400,
        errors_covered=20,
        labelled_uncovered=100,
        errors_uncovered=30,
        probe_trials=200,
        probe_errors=40,
    )
    report = coverage_bound(counts, 0.95)
    # H* = c eps + (1 - c) delta = .8 * (20/400) + .2 * (40/200) = .04 + .04 = .08
    assert report.bound == pytest.approx(0.08)
    assert report.delta_source == "probe"
    c = wilson_interval(800, 1000)
    eps = wilson_interval(20, 400)
    delta = wilson_interval(40, 200)
    # Linear in c: the extremes are at c_low or c_high. Here delta > eps, so c_low maximises.
    assert report.bound_high == pytest.approx(c.low * eps.high + (1 - c.low) * delta.high)
    assert report.bound_low == pytest.approx(c.high * eps.low + (1 - c.high) * delta.low)
    # Measured H = (20 + 30) / (400 + 100) = .1
    assert report.measured.estimate == pytest.approx(0.1)
    assert report.slack == pytest.approx(report.bound_high - 0.1)
    assert report.status == "holds"
    out = report.to_dict()
    json.dumps(out, allow_nan=False)
    assert out["status"] == "holds" and out["delta_source"] == "probe"


def test_delta_falls_back_to_labelled_uncovered_traffic() -> None:
    report = coverage_bound(
        CoverageCounts(
            requests=100,
            covered=90,
            labelled_covered=50,
            errors_covered=5,
            labelled_uncovered=10,
            errors_uncovered=2,
        )
    )
    assert report.delta_source == "labelled-uncovered"
    assert report.delta.estimate == pytest.approx(0.2)
    assert report.bound == pytest.approx(0.9 * 0.1 + 0.1 * 0.2)


@pytest.mark.parametrize(
    "counts",
    [
        CoverageCounts(requests=0, covered=0),
        CoverageCounts(requests=50, covered=40, probe_trials=10, probe_errors=1),
        CoverageCounts(requests=50, covered=40, labelled_covered=30, errors_covered=3),
        CoverageCounts(requests=50, covered=50, labelled_uncovered=5, probe_trials=3),
    ],
)
def test_insufficient_data(counts: CoverageCounts) -> None:
    report = coverage_bound(counts)
    assert report.status == "insufficient-data"
    out = report.to_dict()
    json.dumps(out, allow_nan=False)  # NaN never reaches JSON
    assert out["bound"] is None and out["slack"] is None


def simulate(
    tracker: CoverageTracker,
    key: str,
    seed: int,
    *,
    coverage: float,
    eps: float,
    leak_by_type: tuple[float, ...],
    requests: int = 4000,
    labelled_fraction: float = 0.5,
    probe_trials: int = 600,
) -> None:
    """Traffic under A1 and A2: uncovered questions have a type with its own leakage
    rate; the probe asks uncovered-by-construction questions of the same mix of types."""
    rng = np.random.default_rng(seed)
    leaks = np.array(leak_by_type)
    covered = rng.random(requests) < coverage
    labelled = rng.random(requests) < labelled_fraction
    qtype = rng.integers(0, leaks.size, requests)
    wrong = np.where(covered, rng.random(requests) < eps, rng.random(requests) < leaks[qtype])
    # Uncovered answers that do not hallucinate mostly abstain.
    abstained = ~covered & ~wrong & (rng.random(requests) < 0.8)
    for i in range(requests):
        tracker.observe_request(key, bool(covered[i]))
        if labelled[i]:
            tracker.observe_label(key, bool(covered[i]), not wrong[i], bool(abstained[i]))
    probe_types = rng.integers(0, leaks.size, probe_trials)
    errors = int((rng.random(probe_trials) < leaks[probe_types]).sum())
    tracker.set_probe(key, probe_trials, errors)


@pytest.mark.parametrize("seed", range(8))
def test_bound_holds_when_the_assumptions_hold(seed: int) -> None:
    tracker = CoverageTracker(window=10_000)
    simulate(tracker, "rb-tatqa", seed, coverage=0.7, eps=0.08, leak_by_type=(0.05, 0.25))
    report = tracker.report("rb-tatqa")
    assert report.status == "holds"
    assert report.delta_source == "probe"
    truth = 0.7 * 0.08 + 0.3 * 0.15
    assert report.bound_low <= truth <= report.bound_high
    assert report.measured.low <= report.bound_high


def test_a_lying_probe_is_caught() -> None:
    # The probe claims delta = 20/1000 = .02; real uncovered error is .6 at c = .5:
    # H = .5 * .05 + .5 * .6 = .325, far above the bound's ~.05.
    tracker = CoverageTracker(window=10_000)
    simulate(tracker, "k", 0, coverage=0.5, eps=0.05, leak_by_type=(0.6,))
    tracker.set_probe("k", 1000, 20)
    report = tracker.report("k")
    assert report.delta.estimate == pytest.approx(0.02)
    assert report.status == "violated"
    assert report.measured.low > report.bound_high
    assert report.slack < 0


def test_tracker_window_ages_out_old_traffic() -> None:
    tracker = CoverageTracker(window=10)
    for _ in range(10):
        tracker.observe_request("a", covered=False)
        tracker.observe_label("a", covered=False, correct=False)
    assert tracker.counts("a").covered == 0
    assert tracker.counts("a").errors_uncovered == 10
    for _ in range(10):
        tracker.observe_request("a", covered=True)
        tracker.observe_label("a", covered=True, correct=True)
    counts = tracker.counts("a")
    assert (counts.requests, counts.covered) == (10, 10)
    assert (counts.labelled_covered, counts.labelled_uncovered, counts.errors_uncovered) == (
        10,
        0,
        0,
    )
    tracker.observe_label("a", covered=True, correct=False, abstained=True)  # abstention
    assert tracker.counts("a").errors_covered == 0


def test_tracker_keys_and_probes() -> None:
    tracker = CoverageTracker(window=5)
    tracker.set_probe(None, 100, 3)
    tracker.observe_request("b", covered=True)
    tracker.observe_request("a", covered=False)
    tracker.set_probe("a", 50, 10)
    assert tracker.keys() == ["a", "b"]
    assert (tracker.counts("a").probe_trials, tracker.counts("a").probe_errors) == (50, 10)
    assert (tracker.counts("b").probe_trials, tracker.counts("b").probe_errors) == (100, 3)
    assert tracker.counts("never-seen").requests == 0
    assert tracker.report("never-seen").status == "insufficient-data"
    assert tracker.snapshot()["b"]["covered"] == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requests": 5, "covered": 6},
        {"requests": -1, "covered": 0},
        {"requests": 5, "covered": 1, "labelled_covered": 2, "errors_covered": 3},
        {"requests": 5, "covered": 1, "probe_trials": 2, "probe_errors": 3},
        {"requests": 5, "covered": True},
    ],
)
def test_bad_counts(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfidenceDataError):
        CoverageCounts(**kwargs)


def test_bad_settings() -> None:
    with pytest.raises(ConfigError):
        CoverageTracker(window=0)
    with pytest.raises(ConfigError):
        coverage_bound(CoverageCounts(requests=1, covered=1), confidence=1.0)
    with pytest.raises(ConfidenceDataError):
        CoverageTracker().set_probe(None, 3, 4)


def test_labels_drawn_more_often_from_uncovered_answers_do_not_fake_a_violation() -> None:
    # Users flag bad answers: 1 % of covered and 20 % of uncovered answers get a label.
    # The pooled rate over labels is then mostly the uncovered stratum's (about .39 here
    # against a true H of about .1) and its interval lay above the bound's high end. The
    # verdict compares the bound with the rate re-weighted by stratum instead.
    rng = np.random.default_rng(1)
    tracker = CoverageTracker(window=10_000)
    wrong_total = 0
    for i in range(10_000):
        covered = bool(rng.random() < 0.9)
        wrong = bool(rng.random() < (0.05 if covered else 0.5))
        wrong_total += wrong
        tracker.observe_request("k", covered)
        if rng.random() < (0.01 if covered else 0.20):
            tracker.observe_label("k", covered, correct=not wrong, label_id=f"r{i}")
    tracker.set_probe("k", 2000, 1000)  # an honest probe: delta = .5
    report = tracker.report("k")
    truth = wrong_total / 10_000
    assert report.measured.low > report.bound_high  # the pooled rate alone: "violated"
    assert report.status == "holds"
    assert report.measured_weighted == pytest.approx(truth, abs=0.05)
    assert report.measured_weighted_low <= truth <= report.measured_weighted_high
    assert report.bound_low <= truth <= report.bound_high


def test_without_a_probe_the_bound_is_an_estimate_not_a_test() -> None:
    # delta from labelled uncovered traffic: the weighted rate is the bound's own point
    # estimate, so the same labels cannot contradict it
    tracker = CoverageTracker(window=10_000)
    for i in range(400):
        tracker.observe_request("k", i % 2 == 0)
        tracker.observe_label("k", i % 2 == 0, correct=i % 4 != 0, label_id=f"r{i}")
    report = tracker.report("k")
    assert report.delta_source == "labelled-uncovered"
    assert report.measured_weighted == pytest.approx(report.bound)
    assert report.status == "holds"
