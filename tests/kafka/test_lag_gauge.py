"""``guardrail.consumer.lag``: from the offset a commit would carry to the partition's end.

Audit: it was the end minus the consumer's position, so records read but not finished
(queued, in the processor) did not count: 0 against a real group lag of 2,836 under
backpressure, and 0 while the processor was held for 70 s.
"""

from __future__ import annotations

from sidecar.kafka.clients import TP
from sidecar.kafka.intake import measure_lag, measure_uncommitted
from sidecar.pipeline.offsets import OffsetTracker

TOPIC: TP = ("rag.retrieval", 0)


class _Consumer:
    def __init__(self, high: int | None, position: int | None) -> None:
        self._high, self._position = high, position

    def highwater(self, tp: TP) -> int | None:
        return self._high

    def position(self, tp: TP) -> int | None:
        return self._position


def test_records_read_but_not_finished_count_as_lag() -> None:
    tracker = OffsetTracker()
    for offset in range(40, 60):  # read: 40..59, the consumer's position is 60
        tracker.track(TOPIC, offset)
    for offset in range(40, 45):  # finished: 40..44; 45.. queued or in the processor
        tracker.done(TOPIC, offset)
    consumer = _Consumer(high=100, position=60)
    assert measure_uncommitted(consumer, [TOPIC], tracker) == {TOPIC: 55}  # type: ignore[arg-type]
    assert measure_lag(consumer, [TOPIC], tracker) == {TOPIC: 40}  # type: ignore[arg-type]
    for offset in range(45, 60):
        tracker.done(TOPIC, offset)
    assert measure_uncommitted(consumer, [TOPIC], tracker) == {TOPIC: 40}  # type: ignore[arg-type]


def test_a_partition_nothing_was_read_from_counts_from_the_position() -> None:
    consumer = _Consumer(high=12, position=2)
    got = measure_uncommitted(consumer, [TOPIC], OffsetTracker())  # type: ignore[arg-type]
    assert got == {TOPIC: 10}
    unknown = _Consumer(high=None, position=2)  # not fetched yet: not known, not 0
    assert measure_uncommitted(unknown, [TOPIC], OffsetTracker()) == {}  # type: ignore[arg-type]
