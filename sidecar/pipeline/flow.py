"""Flow control for the join: keep co-partitioned inputs aligned in event time.

A request's retrieval event and generation events share a key, so they sit in
the same partition number of ``rag.retrieval`` and ``rag.generation``. While
the consumer is caught up that is all the join needs. While it catches up on a
backlog (after an outage, a rebalance, a slow period) nothing keeps the two
topics in step: the fetcher may read ten thousand retrievals of partition p
before the generations of the same requests, the join store fills with
half-requests, and the store evicts them by capacity as ``incomplete`` although
their other half is sitting in Kafka.

:class:`InputAligner` decides, per partition number, which side to pause: the
side whose consumed record timestamps run more than ``slack_ms`` ahead of the
other side's, *while the other side still has a backlog* (records in Kafka
not yet consumed). It resumes it once the gap is back under half the slack
(hysteresis: pausing drops the fetcher's read-ahead) or the other side has
nothing left to read. A side is never paused against a partner that is caught
up, so a request whose other half never comes cannot stall a partition: the
join's TTL deals with it as before.

Event-time slack alone does not bound the store: a backlog produced in a
burst packs many requests into one second. So once the join store is more
than half full (``pressure``), any lead at all pauses the side that leads;
the timestamps still decide which side that is, so the side that completes
requests keeps going.

Event time is the record timestamp (producer create time or broker append
time). With timestamps that do not follow production order across the two
topics, alignment is only as good as the timestamps; the join's capacity
eviction remains the backstop. Pure bookkeeping, no Kafka here: the service
applies the decisions with ``consumer.pause`` / ``consumer.resume``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["FlowDecision", "InputAligner"]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class FlowDecision:
    """What to change now: partitions to pause and partitions to resume."""

    pause: frozenset[TopicPartition] = field(default_factory=frozenset)
    resume: frozenset[TopicPartition] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.pause or self.resume)


class InputAligner:
    """Pause the side of a co-partitioned topic pair that runs ahead in event time."""

    def __init__(self, left: str, right: str, slack_ms: int) -> None:
        if left == right:
            raise ValueError("the aligned topics must differ")
        if slack_ms <= 0:
            raise ValueError("slack_ms must be positive (0 disables alignment in the config)")
        self.left = left
        self.right = right
        self.slack_ms = slack_ms
        self._seen: dict[TopicPartition, int] = {}  # highest record timestamp consumed
        self._paused: set[TopicPartition] = set()
        self.pauses = 0  # how many times a partition was paused (a counter for telemetry)

    @property
    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(self._paused)

    def observe(self, topic: str, partition: int, timestamp_ms: int | None) -> None:
        """A record of ``topic[partition]`` with this timestamp was consumed."""
        if timestamp_ms is None or timestamp_ms < 0 or topic not in (self.left, self.right):
            return
        tp = (topic, partition)
        if timestamp_ms > self._seen.get(tp, -1):
            self._seen[tp] = timestamp_ms

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions left this consumer (revoked): their state goes with them."""
        for tp in tps:
            self._seen.pop(tp, None)
            self._paused.discard(tp)

    def decide(
        self,
        assigned: Iterable[TopicPartition],
        backlog: Callable[[TopicPartition], int],
        *,
        pressure: bool = False,
    ) -> FlowDecision:
        """The pauses and resumes that make the assigned pairs aligned.

        ``backlog(tp)`` is how many records of ``tp`` are in Kafka and not yet
        consumed (0 when unknown); ``pressure``: the join store is filling up, so
        the slack shrinks to nothing. Partitions not assigned any more are dropped
        from the paused set without a resume (the consumer forgot them).
        """
        assigned = set(assigned)
        self._paused &= assigned
        want: set[TopicPartition] = set()
        partitions = {p for topic, p in assigned if topic == self.left} & {
            p for topic, p in assigned if topic == self.right
        }
        for p in partitions:
            ahead = self._ahead(p, backlog, 0 if pressure else self.slack_ms)
            if ahead is not None:
                want.add(ahead)
        pause = frozenset(want - self._paused)
        resume = frozenset(self._paused - want)
        self._paused = want
        self.pauses += len(pause)
        return FlowDecision(pause, resume)

    def _ahead(
        self, partition: int, backlog: Callable[[TopicPartition], int], slack_ms: int
    ) -> TopicPartition | None:
        """The side of ``partition`` to keep paused, if any."""
        left, right = (self.left, partition), (self.right, partition)
        for side, other in ((left, right), (right, left)):
            if backlog(other) <= 0 or side not in self._seen:
                continue
            # a partner with a backlog but nothing consumed yet is behind by definition
            gap = self._seen[side] - self._seen.get(other, -(1 << 62))
            limit = slack_ms // 2 if side in self._paused else slack_ms
            if gap > limit:
                return side
        return None
