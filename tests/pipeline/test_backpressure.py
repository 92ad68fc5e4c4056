"""The pause/resume policy of the work queue and the join clock that stands still while behind."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.pipeline.backpressure import Backpressure, Flow, JoinClock


def test_pauses_at_depth_and_resumes_at_half() -> None:
    bp = Backpressure(depth=10)
    assert [bp.decide(q) for q in (0, 5, 9)] == [None, None, None]
    assert (bp.decide(10), bp.paused) == (Flow.PAUSE, True)
    assert [bp.decide(q) for q in (14, 9, 6)] == [None, None, None]  # hysteresis: no flapping
    assert (bp.decide(5), bp.paused) == (Flow.RESUME, False)
    assert bp.decide(12) is Flow.PAUSE
    assert bp.pauses == 2


def test_resume_threshold_is_checked() -> None:
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Backpressure(depth=0)
    with pytest.raises(ValueError, match=r"resume_at must be in \[0, depth=4\)"):
        Backpressure(depth=4, resume_at=4)


@given(st.lists(st.integers(min_value=0, max_value=50), max_size=200))
def test_decisions_alternate_and_follow_the_queue(queue: list[int]) -> None:
    bp = Backpressure(depth=20)
    last: Flow | None = None
    for queued in queue:
        flow = bp.decide(queued)
        if flow is not None:
            assert flow is not last  # pause, resume, pause, ...
            last = flow
        assert not (bp.paused and queued <= bp.resume_at)
        assert bp.paused or queued < bp.depth


def test_the_join_clock_stands_still_while_behind() -> None:
    clock = JoinClock(1_000.0)
    assert clock.read(1_500.0) == 1_500.0
    clock.set_behind(True, 2_000.0)
    assert clock.read(9_000.0) == 2_000.0  # seven seconds behind are not charged
    clock.set_behind(False, 10_000.0)
    assert clock.read(10_250.0) == 2_250.0
    assert clock.held_ms == 8_000.0
    assert clock.read(10_000.0) == 2_250.0  # never backwards


def test_the_queue_depth_holds_at_least_one_poll() -> None:
    assert Settings.load(kafka={"max_poll_records": 50, "max_queued_records": 50})
    with pytest.raises(ConfigError, match=r"max_queued_records must be in \[max_poll_records=500"):
        Settings.load(kafka={"max_queued_records": 100})
    with pytest.raises(ConfigError, match=r"MAX_QUEUED_RECORDS.*less than or equal to 1000000"):
        Settings.load(kafka={"max_queued_records": 2_000_000})
