"""The handover in a commit's metadata: which records above the commit the next owner skips."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.kafka.clients import MemoryConsumerPort
from sidecar.kafka.commits import Committer
from sidecar.kafka.cut import KeyIndex
from sidecar.kafka.handover import MAX_METADATA_CHARS, Handover, decode, encode
from sidecar.kafka.readiness import LoopState
from sidecar.pipeline.offsets import OffsetTracker


@given(
    mark=st.integers(0, 10**12),
    span=st.integers(1, 5_000),
    picks=st.sets(st.integers(0, 4_999), max_size=300),
)
def test_the_next_owner_skips_exactly_what_was_finished_between_the_mark_and_the_horizon(
    mark: int, span: int, picks: set[int]
) -> None:
    pending = sorted({mark} | {mark + p for p in picks if p < span})
    metadata = encode(mark, mark + span, pending)
    assert metadata is not None and len(metadata) <= MAX_METADATA_CHARS
    handover = decode(mark, metadata)
    assert handover is not None
    for offset in range(max(0, mark - 2), mark + span + 2):
        finished = mark <= offset < mark + span and offset not in pending
        assert handover.finished(offset) is finished, offset


def test_many_short_runs_go_as_a_bitmap_and_past_its_limit_nothing_is_written() -> None:
    """Second review: a streaming answer's deltas made ~800 pending records a partition,
    interleaved with decided ones: the runs no longer fit, and commits stood still."""
    assert encode(0, 4_000, list(range(2_000))) == "h1:0:334:0-1jj"  # one run: short
    every_other = list(range(7, 20_007, 2))  # 10,000 single-offset runs over 20,000 records
    metadata = encode(7, 20_007, every_other)
    assert metadata is not None and metadata.startswith("h2:") and len(metadata) < 3_400
    handover = decode(7, metadata)
    assert handover is not None and handover.horizon == 20_007
    assert [o for o in range(5, 20_010) if handover.finished(o)] == list(range(8, 20_007, 2))
    assert encode(0, 60_000, list(range(0, 60_000, 2))) is None  # past both encodings
    assert decode(7, metadata[:-4]) is None  # a bitmap cut short is no handover


@pytest.mark.parametrize(
    "metadata",
    [
        "",  # another tool's commit (kafka-consumer-groups --reset-offsets writes none)
        "checkpoint 17",
        "h1:zz:10:",  # written at another offset: someone moved the commit since
        "h1:a:10:3-1",  # a run that ends before it starts
        "h1:a:10:4,2",  # runs out of order
        "h1:a:10:x:y",
        "h1:a:!:",
    ],
)
def test_metadata_that_is_not_a_handover_for_this_offset_is_ignored(metadata: str) -> None:
    assert decode(10, metadata) is None


def _overlapping(tracker: OffsetTracker, keys: KeyIndex, n: int) -> None:
    """Requests that each overlap the next, as a streaming service writes them: request i's
    retrieval (r: i), its first delta (g: 2i), then request i-1's final (g: 2i+1), which
    decides i-1. Request n-1 is still open."""
    retrieval, generation = ("r", 0), ("g", 0)

    def read(tp: tuple[str, int], offset: int, i: int) -> None:
        tracker.track(tp, offset)
        keys.note(tp[0], tp[1], offset, f"req-{i}".encode())

    for i in range(n):
        read(retrieval, i, i)
        read(generation, 2 * i, i)
        if i >= 1:
            read(generation, 2 * i + 1, i - 1)
            for tp, offset in (
                (retrieval, i - 1),
                (generation, 2 * i - 2),
                (generation, 2 * i + 1),
            ):
                tracker.done(tp, offset)


def test_under_steady_overlapping_traffic_the_commit_moves_with_the_oldest_open_request() -> None:
    """Audit: the cut lowered until no request straddled it fell back to the last idle moment
    (here, offset 0) and stayed there while traffic flowed."""
    tracker, keys = OffsetTracker(), KeyIndex(("r", "g"))
    committer = Committer(tracker, keys, LoopState())
    consumer = MemoryConsumerPort()
    _overlapping(tracker, keys, 100)
    marks = {("r", 0): 99, ("g", 0): 198}  # the open request's first records
    assert keys.cut(marks) == {("r", 0): 0, ("g", 0): 0}  # every request straddles the last
    assert asyncio.run(committer.commit(consumer)) == marks
    handovers = {tp: decode(consumer.committed[tp], m) for tp, m in consumer.metadata.items()}
    r, g = handovers[("r", 0)], handovers[("g", 0)]
    assert r is not None and g is not None
    # request 98 was decided across the commit: its final (g 199) is skipped, not read as a half
    assert g.finished(199) and not g.finished(198)  # 199: req-98's final; 198: req-99's delta
    assert not r.finished(99)  # the open request is read again whole
    assert committer.fallbacks == 0


def test_a_handover_that_does_not_fit_falls_back_to_the_lowered_cut() -> None:
    tracker, keys = OffsetTracker(), KeyIndex(("r", "g"))
    committer = Committer(tracker, keys, LoopState())
    for offset in range(0, 60_000):  # every other record still pending: 30,000 runs
        tracker.track(("g", 0), offset)
        keys.note("g", 0, offset, f"k{offset // 2}".encode())
        if offset % 2:
            tracker.done(("g", 0), offset)
    consumer = MemoryConsumerPort()
    asyncio.run(committer.commit(consumer))
    assert committer.fallbacks == 1
    assert consumer.metadata == {("g", 0): ""}


def test_both_input_topics_of_a_partition_number_are_committed_from_one_snapshot() -> None:
    tracker, keys = OffsetTracker(), KeyIndex(("r", "g"))
    committer = Committer(tracker, keys, LoopState())
    consumer = MemoryConsumerPort()
    _overlapping(tracker, keys, 3)
    asyncio.run(committer.commit(consumer))
    first = dict(consumer.metadata)
    tracker.track(("g", 0), 6)  # only the generation topic moves on...
    tracker.done(("g", 0), 6)
    tracker.done(("g", 0), 4)
    tracker.done(("g", 0), 5)
    tracker.done(("r", 0), 2)  # ...and the open request is decided: both marks move
    asyncio.run(committer.commit(consumer))
    assert consumer.committed == {("r", 0): 3, ("g", 0): 7}
    assert consumer.metadata != first
    assert {
        tp: decode(consumer.committed[tp], m) is not None for tp, m in consumer.metadata.items()
    }


def test_a_partition_taken_with_a_handover_passes_on_what_it_has_not_read_yet() -> None:
    """Audit: a second takeover before the first had read to the inherited horizon committed
    only as far as it had read; the records its last owner had finished beyond that were
    read again by the next one, and requests decided across them came back as halves."""
    tracker, keys = OffsetTracker(), KeyIndex(("r", "g"))
    inherited = {("g", 0): Handover(start=0, horizon=100, pending=((50, 50), (97, 99)))}
    committer = Committer(tracker, keys, LoopState(), inherited)
    for offset in range(10):  # read 0..9: finished before (skipped) or decided here
        tracker.track(("g", 0), offset)
        tracker.done(("g", 0), offset)
    consumer = MemoryConsumerPort()
    assert asyncio.run(committer.commit(consumer)) == {("g", 0): 10}
    handover = decode(10, consumer.metadata[("g", 0)])
    assert handover is not None and handover.horizon == 100
    assert [o for o in range(10, 101) if not handover.finished(o)] == [50, 97, 98, 99, 100]


def test_the_handover_is_committed_again_while_the_mark_stands() -> None:
    """Audit: only a moved mark was committed; one request held open for its TTL froze the
    handover, and a restart then decided again everything finished since."""
    tracker, keys = OffsetTracker(), KeyIndex(("r", "g"))
    committer = Committer(tracker, keys, LoopState())
    consumer = MemoryConsumerPort()
    tracker.track(("g", 0), 0)  # held open: the mark stays at 0
    asyncio.run(committer.commit(consumer))
    first = consumer.metadata[("g", 0)]
    for offset in range(1, 30):
        tracker.track(("g", 0), offset)
        tracker.done(("g", 0), offset)
    asyncio.run(committer.commit(consumer))
    handover = decode(0, consumer.metadata[("g", 0)])
    assert consumer.metadata[("g", 0)] != first
    assert handover is not None and handover.horizon == 30 and handover.finished(29)
    assert asyncio.run(committer.commit(consumer)) == {}  # nothing changed: nothing committed


def test_after_a_handover_an_overflow_keeps_the_last_commit_rather_than_a_lowered_cut() -> None:
    """Audit: the key index forgets keys below a handover's mark, so the fallback cut after
    it committed marks a decided request straddled, with no metadata: a half for the next
    owner. The last commit (a handover, consistent) stands instead."""
    tracker, keys = OffsetTracker(), KeyIndex(("r", "g"))
    state = LoopState()
    committer = Committer(tracker, keys, state)
    consumer = MemoryConsumerPort()
    committer.assigned_with(("g", 0), 0, "h1:0:1:0")  # taken with a handover
    for offset in range(0, 60_000):  # every other record pending: the handover cannot fit
        tracker.track(("g", 0), offset)
        if offset % 2:
            tracker.done(("g", 0), offset)
    assert asyncio.run(committer.commit(consumer)) == {}
    assert (committer.holds, committer.fallbacks) == (1, 0)
    assert consumer.committed == {}
