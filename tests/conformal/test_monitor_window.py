"""``ExchangeabilityMonitor.record_m1`` keeps the counts and states a plain recount gives.

The window's success count is carried from observation to observation (the oldest
value leaves it once the window is full); these hold every observation's status to
one recounted from the last ``window`` values, with the hysteresis of a broken alarm,
over random streams of m1 values (also ``window=1`` and ``min_samples=window``).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.conformal.monitor import ExchangeabilityMonitor, MonitorState
from sidecar.stats.intervals import wilson_interval


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.booleans(), max_size=120),
    st.integers(1, 30),
    st.data(),
    st.sampled_from([0.05, 0.1, 0.5]),
)
def test_every_observation_reads_as_a_recount_of_the_window(
    m1s: list[bool], window: int, data: st.DataObject, alpha: float
) -> None:
    min_samples = data.draw(st.integers(1, window))
    monitor = ExchangeabilityMonitor(window=window, confidence=0.9, min_samples=min_samples)
    target = 1 - alpha
    state = MonitorState.WARMING_UP
    for i, m1 in enumerate(m1s):
        kept = m1s[max(0, i + 1 - window) : i + 1]
        successes, n = sum(kept), len(kept)
        if n < min_samples:
            want = MonitorState.WARMING_UP
        elif wilson_interval(successes, n, 0.9).high < target or (
            state is MonitorState.BROKEN and successes / n < target
        ):
            want = MonitorState.BROKEN
        else:
            want = MonitorState.OK
        status = monitor.observe_m1("k", m1, alpha, calibration_id="c")
        assert (status.state, status.changed) == (want, want is not state)
        assert (status.n, status.m1_mean) == (n, successes / n)
        assert type(status.interval.successes) is int  # never a bool read as 0 or 1
        state = want
