from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.pipeline.offsets import OffsetTracker

TP = ("rag.retrieval", 0)


def test_low_water_is_the_smallest_pending_offset() -> None:
    t = OffsetTracker()
    for off in (5, 6, 7):
        t.track(TP, off)
    t.done(TP, 6)
    assert t.committable() == {TP: 5}
    t.done(TP, 5)
    assert t.committable() == {TP: 7}
    t.done(TP, 7)
    assert t.committable() == {TP: 8}


def test_committable_reports_only_moves() -> None:
    t = OffsetTracker()
    t.track(TP, 0)
    t.done(TP, 0)
    first = t.committable()
    t.mark_committed(first)
    assert t.committable() == {}


def test_forget_drops_revoked_partitions() -> None:
    t = OffsetTracker()
    t.track(TP, 0)
    t.forget({TP})
    assert t.committable() == {}
    assert t.pending_count() == 0


@given(
    st.lists(st.booleans(), min_size=1, max_size=200),
)
def test_commit_never_passes_a_pending_message(finished: list[bool]) -> None:
    t = OffsetTracker()
    for off in range(len(finished)):
        t.track(TP, off)
    for off, is_done in enumerate(finished):
        if is_done:
            t.done(TP, off)
    mark = t.committable()[TP]
    pending = [off for off, is_done in enumerate(finished) if not is_done]
    if pending:
        assert mark == min(pending)
    else:
        assert mark == len(finished)
