"""The pause/resume policy of the work queue and the join clock that stands still while behind."""

from __future__ import annotations

import pytest
from aiokafka import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.intake import WorkQueue
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


def test_pauses_at_max_bytes_and_resumes_at_half_the_bytes() -> None:
    """A few records of a megabyte each must not wait by the thousand: bytes bound the queue."""
    bp = Backpressure(depth=1_000, max_bytes=4_000_000)
    assert bp.decide(3, 3_000_000) is None
    assert (bp.decide(4, 4_000_000), bp.paused) == (Flow.PAUSE, True)
    assert bp.decide(2, 2_500_000) is None  # few records, but more than half the bytes
    assert (bp.decide(2, 2_000_000), bp.paused) == (Flow.RESUME, False)
    assert bp.decide(1_000, 10) is Flow.PAUSE  # the record depth still holds
    assert bp.decide(499, 10) is Flow.RESUME
    with pytest.raises(ValueError, match="max_bytes must be >= 1"):
        Backpressure(depth=10, max_bytes=0)


def test_the_queue_byte_bound_is_checked() -> None:
    assert Settings.load().kafka.max_queued_bytes == 64 * 1024 * 1024
    with pytest.raises(ConfigError, match="MAX_QUEUED_BYTES"):
        Settings.load(kafka={"max_queued_bytes": 1_000})


async def test_the_work_queue_counts_bytes_in_and_out_and_on_revocation() -> None:
    def record(partition: int, value: bytes) -> ConsumerRecord[bytes, bytes]:
        return ConsumerRecord(
            topic="rag.retrieval", partition=partition, offset=0, timestamp=0,
            timestamp_type=0, key=b"req-1", value=value, checksum=None,
            serialized_key_size=5, serialized_value_size=len(value),
            headers=(("traceparent", b"x" * 55),),
        )  # fmt: skip

    queue = WorkQueue()
    queue.put((record(0, b"a" * 1_000), record(1, b"b" * 2_000)))
    queue.put((record(1, b"c" * 4_000),))
    per_record = 5 + 128 + len("traceparent") + 55  # a header counts 128 beside its bytes
    assert (queue.records, queue.bytes) == (3, 7_000 + 3 * per_record)
    assert queue.drop({("rag.retrieval", 1)}) == 2
    assert (queue.records, queue.bytes) == (1, 1_000 + per_record)
    [only] = await queue.get()
    assert only.value == b"a" * 1_000 and (queue.records, queue.bytes) == (0, 0)
