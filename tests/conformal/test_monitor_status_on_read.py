"""The monitor builds a key's ``MonitorStatus`` when it is read, not per observation.

``ExchangeabilityMonitor.record_m1`` (what the certifier feeds once per decided
request) keeps the window's state and whether the last observation changed it;
``status``, ``statuses``, ``reading`` and ``observe_m1``'s return value are built
from the window. ``_Reference`` is the monitor as it was, building and keeping a
status per observation. Fed the same drawn observations (keys past ``max_keys``,
a new alpha or calibration id mid-stream, windows that fill, break and recover),
the two read the same after every step: the same statuses in the same key order,
the same readings, the same ``observe_m1`` results.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.conformal.monitor import (
    ExchangeabilityMonitor,
    MonitorState,
    MonitorStatus,
    _Window,
)
from sidecar.conformal.quantile import as_alpha
from sidecar.stats.intervals import wilson_interval


class _Reference:
    """``ExchangeabilityMonitor`` as it was: a ``MonitorStatus`` built and kept per observation."""

    def __init__(self, *, window: int, confidence: float, min_samples: int, max_keys: int) -> None:
        self.window = window
        self.confidence = confidence
        self.min_samples = min_samples
        self.max_keys = max_keys
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._last: dict[str, MonitorStatus] = {}

    def observe_m1(
        self, key: str, m1: bool, alpha: float, *, calibration_id: str = ""
    ) -> MonitorStatus:
        win = self._windows.get(key)
        if win is None or win.alpha != alpha or win.calibration_id != calibration_id:
            target = float(1 - as_alpha(alpha))
            win = _Window(alpha=alpha, calibration_id=calibration_id, target=target)
            self._windows[key] = win
        self._windows.move_to_end(key)
        while len(self._windows) > self.max_keys:
            old, _ = self._windows.popitem(last=False)
            self._last.pop(old, None)
        target = win.target
        win.values.append(bool(m1))
        win.successes += int(bool(m1))
        if len(win.values) > self.window:
            win.successes -= int(win.values.popleft())
        n = len(win.values)
        interval = wilson_interval(win.successes, n, self.confidence)
        mean = win.successes / n
        if n < self.min_samples:
            state = MonitorState.WARMING_UP
        elif interval.high < target or (win.state is MonitorState.BROKEN and mean < target):
            state = MonitorState.BROKEN
        else:
            state = MonitorState.OK
        changed = state is not win.state
        win.state = state
        status = MonitorStatus(
            key=key,
            calibration_id=calibration_id,
            state=state,
            changed=changed,
            n=n,
            m1_mean=mean,
            interval=interval,
            target=target,
            min_samples=self.min_samples,
            confidence=self.confidence,
        )
        self._last[key] = status
        return status

    def reading(
        self, key: str, alpha: float, calibration_id: str
    ) -> tuple[MonitorState, float | None]:
        win = self._windows.get(key)
        last = self._last.get(key)
        if win is None or last is None:
            return MonitorState.WARMING_UP, None
        if win.alpha != alpha or win.calibration_id != calibration_id:
            return MonitorState.WARMING_UP, None
        return last.state, last.m1_mean


KEYS = ["a", "b", "c", "d"]
ALPHAS = [0.1, 0.2]
CALIBRATIONS = ["cal-1", "cal-2"]
# mostly misses: windows break (upper bound below 1 - alpha) and recover
_STEP = st.tuples(
    st.sampled_from(KEYS),
    st.booleans() | st.just(False),
    st.sampled_from(ALPHAS),
    st.sampled_from(CALIBRATIONS),
    st.booleans(),  # observe_m1 (its status is read) or record_m1
)


def _same(new: ExchangeabilityMonitor, old: _Reference) -> None:
    assert new.statuses() == dict(old._last)
    assert list(new.statuses()) == list(old._last)  # the same key order
    for key in [*KEYS, "unseen"]:
        assert new.status(key) == old._last.get(key)
        for alpha in ALPHAS:
            for calibration in CALIBRATIONS:
                assert new.reading(key, alpha, calibration) == old.reading(key, alpha, calibration)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(_STEP, min_size=1, max_size=120),
    window=st.integers(1, 12),
    min_samples=st.integers(1, 12),
    max_keys=st.integers(1, 4),
)
def test_statuses_built_on_read_match_those_kept_per_observation(
    steps: list[tuple[str, bool, float, str, bool]], window: int, min_samples: int, max_keys: int
) -> None:
    min_samples = min(min_samples, window)
    new = ExchangeabilityMonitor(
        window=window, confidence=0.9, min_samples=min_samples, max_keys=max_keys
    )
    old = _Reference(window=window, confidence=0.9, min_samples=min_samples, max_keys=max_keys)
    for key, m1, alpha, calibration, read in steps:
        expected = old.observe_m1(key, m1, alpha, calibration_id=calibration)
        if read:
            assert new.observe_m1(key, m1, alpha, calibration_id=calibration) == expected
        else:
            new.record_m1(key, m1, alpha, calibration_id=calibration)
        _same(new, old)


def test_a_break_and_its_recovery_are_edges_of_the_status_read_after_them() -> None:
    """``changed`` marks the observation that changed the state, and only that one."""
    new = ExchangeabilityMonitor(window=10, confidence=0.9, min_samples=5, max_keys=8)
    old = _Reference(window=10, confidence=0.9, min_samples=5, max_keys=8)
    edges = []
    for m1 in [True] * 10 + [False] * 10 + [True] * 12:
        status = old.observe_m1("k", m1, 0.1, calibration_id="c")
        new.record_m1("k", m1, 0.1, calibration_id="c")
        assert new.status("k") == status
        if status.changed:
            edges.append(status.state)
    assert edges == [MonitorState.OK, MonitorState.BROKEN, MonitorState.OK]
