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


def test_skipped_offsets_past_the_last_record_are_done_but_never_a_pending_one() -> None:
    """A transaction's marker (offset 8) is skipped by the consumer: its position, 9, is
    committable once the records before it are done, and not before."""
    t = OffsetTracker()
    t.skipped_to(TP, 4)  # nothing seen on the partition yet: nothing to move
    assert t.committable() == {}
    for off in (6, 7):
        t.track(TP, off)
    t.skipped_to(TP, 9)
    t.skipped_to(TP, 3)  # a position behind what was seen moves nothing
    assert t.next_offset(TP) == 9
    assert t.committable() == {TP: 6}
    t.done(TP, 6)
    t.done(TP, 7)
    assert t.committable() == {TP: 9}


def test_forget_drops_revoked_partitions() -> None:
    t = OffsetTracker()
    t.track(TP, 0)
    t.forget({TP})
    assert t.committable() == {}
    assert t.pending_count() == 0


def test_a_done_read_before_its_topic_was_retired_finishes_nothing_of_the_new_one() -> None:
    """A deleted topic created again under the same name starts over at offset 0: what
    was read from the old one names records of the new one, which stay pending."""
    t = OffsetTracker()
    other = ("rag.generation", 0)
    t.track(TP, 0)
    t.track(other, 3)
    old = t.incarnation(TP[0])
    t.retire({TP[0]})
    assert t.low_water(TP) is None and t.low_water(other) == 3  # only the deleted topic's
    t.track(TP, 0)  # the new topic's first record
    t.done(TP, 0, old)
    assert t.pending_offsets(TP) == [0]
    t.done(TP, 0, t.incarnation(TP[0]))
    assert t.pending_offsets(TP) == []
    t.done(other, 3, 0)  # the generation topic was not retired: still its first life
    assert t.low_water(other) == 4


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


def test_an_open_request_is_evicted_once_too_many_records_were_read_after_it() -> None:
    """The join clock stands still while the sidecar is behind, so the TTL alone never
    ends a half-request during a catch-up: it held its partition's commit, and every
    record read after it stayed in OffsetTracker and KeyIndex (~155 B each; audit:
    +205 MB over a 2M-record backlog with four half-requests). ``max_records_behind``
    bounds that."""
    from sidecar.pipeline.join import JoinStore

    store = JoinStore(10_000, 30_000, max_records_behind=1_000)
    store.note_record()
    half = store.open("half", 0.0)
    for i in range(1_000):
        store.note_record()
        store.open(f"r{i}", 0.0)
        store.close(f"r{i}", 0.0)
    assert store.behind() == []  # 1,000 records after it: still within the bound
    store.note_record()
    assert store.behind() == [half]
    assert store.backlog_evictions == 1 and len(store) == 0
