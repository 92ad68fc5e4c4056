"""Which offsets may be committed: the low-water mark of unfinished messages.

A message is *pending* from the moment it is consumed until everything it
contributes to has been published (its request's verdict, or its dead letter).
Per topic-partition the committable offset is the smallest pending offset, or
one past the highest offset seen when nothing is pending. Committing that and
nothing more means a crash re-reads every message whose result was not yet
published: at-least-once, never zero times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class _PartitionState:
    order: deque[int] = field(default_factory=deque)  # offsets in arrival (= increasing) order
    pending: set[int] = field(default_factory=set)
    next_offset: int | None = None  # one past the highest offset seen
    committed: int | None = None  # last offset handed out by ``committable``


class OffsetTracker:
    """Tracks pending offsets per topic-partition; pure bookkeeping, no Kafka."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _PartitionState] = {}
        self._incarnations: dict[str, int] = {}  # per topic: how often it was ``retire``d

    def track(self, tp: TopicPartition, offset: int) -> None:
        """Record a freshly consumed message as pending."""
        state = self._parts.setdefault(tp, _PartitionState())
        if offset in state.pending:
            return
        state.order.append(offset)
        state.pending.add(offset)
        if state.next_offset is None or offset + 1 > state.next_offset:
            state.next_offset = offset + 1

    def skipped_to(self, tp: TopicPartition, position: int) -> None:
        """The consumer, at ``position``, handed out every record before it: what lies past
        the highest offset seen was skipped (a transaction's marker, an aborted
        transaction's records) and is done. Nothing happens on a partition not seen yet."""
        state = self._parts.get(tp)
        if state is not None and state.next_offset is not None and position > state.next_offset:
            state.next_offset = position

    def done(self, tp: TopicPartition, offset: int, incarnation: int | None = None) -> None:
        """Mark a message finished: its results are published. ``incarnation``: the life of
        its topic it was read in (``None``: the current one); a message of a topic retired
        since finishes nothing, as its offset now names a record of the topic created again
        under the same name."""
        if incarnation is not None and incarnation != self.incarnation(tp[0]):
            return
        state = self._parts.get(tp)
        if state is not None:
            state.pending.discard(offset)

    def pending_count(self) -> int:
        return sum(len(s.pending) for s in self._parts.values())

    def next_offset(self, tp: TopicPartition) -> int | None:
        """One past the highest offset consumed on ``tp`` (the consumer's position)."""
        state = self._parts.get(tp)
        return state.next_offset if state is not None else None

    def pending_offsets(self, tp: TopicPartition) -> list[int]:
        """``tp``'s pending offsets, ascending (all at or above its low-water mark)."""
        state = self._parts.get(tp)
        return sorted(state.pending) if state is not None else []

    def low_water(self, tp: TopicPartition) -> int | None:
        """The offset a commit for ``tp`` may carry now (``None``: nothing seen)."""
        state = self._parts.get(tp)
        if state is None:
            return None
        while state.order and state.order[0] not in state.pending:
            state.order.popleft()
        return state.order[0] if state.order else state.next_offset

    def marks(self) -> dict[TopicPartition, int]:
        """Every partition's low-water mark (moved since the last commit or not)."""
        return {tp: mark for tp in self._parts if (mark := self.low_water(tp)) is not None}

    def committable(self) -> dict[TopicPartition, int]:
        """Offsets that moved since the last call; the caller commits exactly these."""
        out: dict[TopicPartition, int] = {}
        for tp, state in self._parts.items():
            mark = self.low_water(tp)
            if mark is not None and mark != state.committed:
                out[tp] = mark
        return out

    def mark_committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            state = self._parts.get(tp)
            if state is not None:
                state.committed = offset

    def forget(self, partitions: set[TopicPartition]) -> None:
        """Drop revoked partitions: their new owner re-reads from the committed offset."""
        for tp in partitions:
            self._parts.pop(tp, None)

    def incarnation(self, topic: str) -> int:
        """Which life of ``topic`` its messages are read in now: 0, then one more each time
        it is retired."""
        return self._incarnations.get(topic, 0)

    def retire(self, topics: set[str]) -> None:
        """``topics`` were deleted: drop their partitions, and from now on ignore a ``done``
        for what was read from them (requests still open, a batch being decided)."""
        self.forget({tp for tp in self._parts if tp[0] in topics})
        for topic in topics:
            self._incarnations[topic] = self.incarnation(topic) + 1
