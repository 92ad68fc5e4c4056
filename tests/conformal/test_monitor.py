"""The rolling mean(m1) exchangeability monitor."""

from __future__ import annotations

import pytest

from sidecar.conformal.calibrator import RetrievalCalibrator
from sidecar.conformal.certify import certify
from sidecar.conformal.monitor import ExchangeabilityMonitor, MonitorState
from sidecar.exceptions import ConfigError
from sidecar.stats.intervals import wilson_interval


def test_warming_up_then_verdicts() -> None:
    mon = ExchangeabilityMonitor(window=100, confidence=0.95, min_samples=20)
    for _ in range(19):
        status = mon.observe_m1("k", False, 0.1)
        assert status.state is MonitorState.WARMING_UP
    status = mon.observe_m1("k", False, 0.1)
    assert status.state is MonitorState.BROKEN
    assert status.changed
    assert status.broken
    assert "exchangeability broken, recalibrate" in status.message
    assert status.interval == wilson_interval(0, 20, 0.95)
    assert status.target == pytest.approx(0.9)


def test_alarm_is_the_wilson_upper_bound_below_one_minus_alpha() -> None:
    # 40 of 50 is 0.8; Wilson 95% upper bound 0.888 < 0.9 -> broken at alpha = 0.1,
    # but 0.888 >= 0.85 -> fine at alpha = 0.15.
    assert wilson_interval(40, 50, 0.95).high < 0.9 <= wilson_interval(41, 50, 0.95).high
    for alpha, expected in ((0.1, MonitorState.BROKEN), (0.15, MonitorState.OK)):
        mon = ExchangeabilityMonitor(window=50, confidence=0.95, min_samples=50)
        for i in range(50):
            status = mon.observe_m1("k", i < 40, alpha)
        assert status.state is expected
        assert status.n == 50
        assert status.m1_mean == 0.8


def test_window_rolls_and_recovers() -> None:
    mon = ExchangeabilityMonitor(window=50, confidence=0.95, min_samples=10)
    for _ in range(50):
        mon.observe_m1("k", False, 0.1)
    changes = []
    for _ in range(200):
        status = mon.observe_m1("k", True, 0.1)
        if status.changed:
            changes.append(status.state)
    assert status.state is MonitorState.OK
    assert status.n == 50
    assert status.m1_mean == 1.0
    assert changes == [MonitorState.OK]  # one edge, not one alert per event


def test_keys_are_independent_and_new_alpha_restarts() -> None:
    mon = ExchangeabilityMonitor(window=30, min_samples=5)
    for _ in range(10):
        mon.observe_m1("a", False, 0.1)
        mon.observe_m1("b", True, 0.1)
    a, b = mon.status("a"), mon.status("b")
    assert a is not None and b is not None
    assert a.broken and not b.broken
    status = mon.observe_m1("a", False, 0.2)  # recalibrated: a fresh window
    assert status.n == 1
    assert status.state is MonitorState.WARMING_UP
    mon.reset("b")
    assert mon.status("b") is None
    assert set(mon.statuses()) == {"a"}
    mon.reset()
    assert mon.statuses() == {}


def test_observe_takes_key_and_alpha_from_the_certification() -> None:
    raw = [[6.0, 4.0, 2.5], [5.0, 3.0], [5.5, 4.5, 2.0]]
    labels = [[True, False, False], [True, False], [False, True, False]]
    cal = RetrievalCalibrator(0.5).fit(raw).calibrate(raw, labels).calibration_
    mon = ExchangeabilityMonitor(window=10, min_samples=1)
    status = mon.observe(certify([6.0, 2.0], cal, calibration_id="toy"))
    assert (status.key, status.calibration_id, status.target, status.m1_mean) == (
        "global",
        "toy",
        0.5,
        1.0,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": 0},
        {"window": 10, "min_samples": 11},
        {"min_samples": 0},
        {"confidence": 1.0},
        {"confidence": 0.0},
    ],
)
def test_bad_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ExchangeabilityMonitor(**kwargs)  # type: ignore[arg-type]


def test_alarm_holds_until_the_mean_is_back() -> None:
    mon = ExchangeabilityMonitor(window=100, confidence=0.95, min_samples=100)
    for i in range(100):
        status = mon.observe_m1("k", i >= 20, 0.1)  # 80 of 100, the misses oldest
    assert status.broken
    # 88 of 100: the upper bound is back above 0.9 but the mean is still below it
    for _ in range(8):
        status = mon.observe_m1("k", True, 0.1)
    assert status.m1_mean == 0.88
    assert wilson_interval(88, 100, 0.95).high >= 0.9
    assert status.broken
    fresh = ExchangeabilityMonitor(window=100, confidence=0.95, min_samples=100)
    for i in range(100):
        other = fresh.observe_m1("k", i < 88, 0.1)
    assert other.state is MonitorState.OK  # the same window, without a prior alarm
    for _ in range(2):
        status = mon.observe_m1("k", True, 0.1)
    assert status.m1_mean == 0.9
    assert status.state is MonitorState.OK
    assert status.changed
