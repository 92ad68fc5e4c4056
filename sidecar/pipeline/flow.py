"""Flow control for the join: keep co-partitioned inputs level in event time.

A request's retrieval event and generation events share a key, so they sit in
the same partition number of ``rag.retrieval`` and ``rag.generation``. While
the consumer is caught up that is all the join needs. While it catches up on a
backlog (after an outage, a rebalance, a slow period) nothing keeps the two
topics in step: the fetcher may read ten thousand retrievals of partition p
before the generations of the same requests; the join store fills with
half-requests, evicts them by capacity, or they outlive the TTL while a slow
signal (the claim verifier) works through the other topic, and they come out
``incomplete`` although their other half is sitting in Kafka.

:class:`InputAligner` decides, per partition number, which side to pause: the
side whose consumed record timestamps lead the other side's by more than
``slack_ms`` (default 0: level), *while the other side is at least
``min_backlog`` records behind* (the service uses one consumed batch, so a
live stream's few records in flight never cause a pause). It resumes it once
the other side has caught up to within half the slack or has less than that
backlog left. A retrieval is written before its answer's final event, so
with both sides level every request's retrieval has been read by the time its
final event is: the store holds about (request rate x generation time) open
requests, as when caught up, instead of the whole backlog. A side is never
held for a partner that has (almost) nothing left to read, so a request whose
other half never comes cannot stall a partition; the join's TTL deals with it
as before.

Event time is the record timestamp (producer create time or broker append
time); with timestamps that do not follow production order across the two
topics, alignment is only as good as the timestamps, and the join's capacity
eviction remains the backstop. A side's event time is the
:data:`CONFIRMING`-th highest timestamp of its last :data:`WINDOW` records, and a
timestamp more than :data:`FUTURE_TOLERANCE_MS` ahead of the wall clock is not
event time at all: one record cannot move a side. Before, the highest timestamp
ever consumed was the side's time, and one junk record stamped 59 minutes ahead
(Kafka 4 accepts up to an hour; older brokers anything) made its side "ahead"
for the rest of a catch-up: 970 of 1,500 requests of a backlog came out
``incomplete``. A producer whose clock is off (one side's clock 10 minutes
behind the other's, every record of a side stamped beyond the tolerance, a
few records stamped minutes ahead) kept a side paused for the whole backlog
of its partner all the same, which is no alignment at all (audit: 1,023-1,200
of the same 1,500 requests incomplete, as many as with alignment off). So a
pause has a budget, ``max_lead_records`` of its partner's records read while
it holds: a gap the partner has not closed by then is taken for clock skew
between the two sides, learned per partition (:meth:`InputAligner.skew_ms`),
and the sides are compared net of it from then on; a partner that has no event
time at all by then (every timestamp ignored) leaves the pair unaligned until
it has one. The budget is the larger of ``max_lead_records`` and the partner
records that match twice the side's lead in production (its records read since
it was last level, at most ``max_lead_records``), counted at the partner's
records per record of the side's (read since the assignment plus backlog: the
production ratio of the span). A streaming answer is one retrieval and 30-100
generation records; a budget of partner records alone ran out while generation
was still reading the answers of one retrieval fetch, every pause took that gap
for skew, and the skews added up, so retrieval ran ahead further at each pause
until the store evicted (audit, real broker, 3,000 requests of 100 deltas,
store 1,000: 1,561 incomplete, skew "learned" -35 s with identical clocks; 0
and none learned now).

Labels (``rag.feedback``, co-partitioned too) come after their request's answer.
Re-deciding old traffic (a group reset to yesterday, a second group) finds them
all in Kafka: small records, read far ahead of the inputs they label, and a label
read before any event of its request waits in a bounded pool that gave up its
oldest, the very labels of the requests decided next (audit: 1,293 of 13,000
labels unmatched). So the labels' partition is paused, too, while its event time
leads the pair's (the least advanced side that has a backlog) and resumed when it
does not or when the pair has less than ``min_backlog`` left: labels are read about
when they were written, after their answers, as live. Their producer's clock is not
learned: a skew only delays labels until the pair has (almost) nothing left.

Pure bookkeeping, no Kafka here: the service applies the decisions with
``consumer.pause`` / ``consumer.resume``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = ["CONFIRMING", "FUTURE_TOLERANCE_MS", "WINDOW", "FlowDecision", "InputAligner"]

TopicPartition = tuple[str, int]

WINDOW: Final = 16  # a side's most recent record timestamps considered
CONFIRMING: Final = 4  # records of the window at or past a side's event time
FUTURE_TOLERANCE_MS: Final = 300_000  # producers' clocks may run this far ahead


@dataclass(frozen=True, slots=True)
class FlowDecision:
    """What to change now: partitions to pause and partitions to resume."""

    pause: frozenset[TopicPartition] = field(default_factory=frozenset)
    resume: frozenset[TopicPartition] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.pause or self.resume)


class InputAligner:
    """Pause the side of a co-partitioned topic pair that runs ahead in event time."""

    def __init__(
        self,
        left: str,
        right: str,
        slack_ms: int = 0,
        min_backlog: int = 1,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000,
        *,
        max_lead_records: int | None = None,
        labels: str | None = None,
    ) -> None:
        """``max_lead_records``: partner records read while a side is paused after which
        the gap left is taken for clock skew (``None``: no budget, pauses hold as long as
        the partner has a backlog). ``labels``: the feedback topic, held behind the pair."""
        if left == right or labels in (left, right):
            raise ValueError("the aligned topics must differ")
        if slack_ms < 0:
            raise ValueError(f"slack_ms must be >= 0, got {slack_ms}")
        if min_backlog < 1:
            raise ValueError(f"min_backlog must be >= 1, got {min_backlog}")
        if max_lead_records is not None and max_lead_records < 1:
            raise ValueError(f"max_lead_records must be >= 1, got {max_lead_records}")
        self.left = left
        self.right = right
        self.labels = labels
        self.slack_ms = slack_ms
        self.min_backlog = min_backlog
        self._wall_ms = wall_ms
        self.max_lead_records = max_lead_records
        self._read_while_paused: dict[TopicPartition, int] = {}  # paused side -> partner reads
        self._budget: dict[TopicPartition, int] = {}  # paused side -> partner reads it may hold
        self._lead: dict[TopicPartition, int] = {}  # side -> its records read since it was level
        self._read: dict[TopicPartition, int] = {}  # side -> its records read since assigned
        self._skew: dict[int, int] = {}  # per partition: how far right's clock runs ahead, ms
        self._blind: set[int] = set()  # partitions left unaligned: a partner without a time
        self._recent: dict[TopicPartition, deque[int]] = {}  # the last WINDOW timestamps
        self._paused: set[TopicPartition] = set()
        self.pauses = 0  # how many times a partition was paused (a counter for telemetry)
        self.future = 0  # timestamps ignored: too far ahead of the wall clock
        self.skews = 0  # pauses out of budget that learned a skew or left the pair unaligned

    @property
    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(self._paused)

    def observe(self, topic: str, partition: int, timestamp_ms: int | None) -> None:
        """A record of ``topic[partition]`` with this timestamp was consumed."""
        if topic not in (self.left, self.right, self.labels):
            return
        if topic != self.labels:
            other = self._partner((topic, partition))
            self._lead[(topic, partition)] = self._lead.get((topic, partition), 0) + 1
            self._read[(topic, partition)] = self._read.get((topic, partition), 0) + 1
            if other in self._read_while_paused:  # any record read counts, whatever its stamp
                self._read_while_paused[other] += 1
        if timestamp_ms is None or timestamp_ms < 0:
            return
        if timestamp_ms > self._wall_ms() + FUTURE_TOLERANCE_MS:
            self.future += 1
            return
        recent = self._recent.get((topic, partition))
        if recent is None:
            recent = self._recent[(topic, partition)] = deque(maxlen=WINDOW)
        recent.append(timestamp_ms)

    def event_time(self, tp: TopicPartition) -> int | None:
        """The side's event time: the CONFIRMING-th highest of its last WINDOW timestamps
        (the lowest while it has fewer); ``None`` before its first record."""
        recent = self._recent.get(tp)
        if not recent:
            return None
        ordered = sorted(recent)
        return ordered[-CONFIRMING] if len(ordered) >= CONFIRMING else ordered[0]

    def skew_ms(self, partition: int) -> int:
        """How far the right side's timestamps are taken to run ahead of the left's on
        ``partition`` (learned when a pause ran out of budget; 0 until then)."""
        return self._skew.get(partition, 0)

    def _aligned_time(self, tp: TopicPartition) -> int | None:
        at = self.event_time(tp)
        return None if at is None else self._net_of_skew(tp, at)

    def _net_of_skew(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """A timestamp of ``tp`` on the left side's clock (the right's runs ``skew_ms`` ahead)."""
        return timestamp_ms if tp[0] == self.left else timestamp_ms - self.skew_ms(tp[1])

    def _partner(self, tp: TopicPartition) -> TopicPartition:
        """The other input topic's partition of the same number."""
        return (self.right if tp[0] == self.left else self.left, tp[1])

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions left this consumer (revoked): their state goes with them."""
        for tp in tps:
            self._recent.pop(tp, None)
            self._paused.discard(tp)
            self._read_while_paused.pop(tp, None)
            self._budget.pop(tp, None)
            self._lead.pop(tp, None)
            self._read.pop(tp, None)
            self._skew.pop(tp[1], None)
            self._blind.discard(tp[1])

    def decide(
        self, assigned: Iterable[TopicPartition], backlog: Callable[[TopicPartition], int]
    ) -> FlowDecision:
        """The pauses and resumes that keep the assigned pairs level.

        ``backlog(tp)`` is how many records of ``tp`` are in Kafka and not yet
        consumed (0 when unknown). Partitions not assigned any more are dropped
        from the paused set without a resume (the consumer forgot them).
        """
        assigned = set(assigned)
        self._paused &= assigned
        want: set[TopicPartition] = set()
        partitions = {p for topic, p in assigned if topic == self.left} & {
            p for topic, p in assigned if topic == self.right
        }
        labels = {(self.labels, p) for p in partitions if self.labels is not None} & assigned
        for p in partitions:
            ahead = self._ahead(p, backlog)
            if ahead is not None:
                want.add(ahead)
        want |= {tp for tp in labels if self._labels_ahead(tp, backlog)}
        pause = frozenset(want - self._paused)
        resume = frozenset(self._paused - want)
        self._paused = want
        for tp in pause - labels:
            self._read_while_paused[tp] = 0
            if (budget := self._budget_of(tp, backlog)) is not None:
                self._budget[tp] = budget
        for tp in set(self._read_while_paused) - want:
            self._read_while_paused.pop(tp, None)
            self._budget.pop(tp, None)
        for tp in assigned - want:  # level (or not aligned): a later lead counts from here
            if tp[0] in (self.left, self.right):
                self._lead[tp] = 0
        self.pauses += len(pause)
        return FlowDecision(pause, resume)

    def _budget_of(
        self, side: TopicPartition, backlog: Callable[[TopicPartition], int]
    ) -> int | None:
        """Partner records a pause of ``side`` may wait for before the gap is taken for skew:
        ``max_lead_records``, or the partner's records matching twice the side's lead (at
        most ``max_lead_records`` of the side's): as many as before for a partner with no
        more records than the side, so the gap left by a skew is no wider."""
        if self.max_lead_records is None:
            return None
        other = self._partner(side)
        records = {tp: self._read.get(tp, 0) + backlog(tp) for tp in (side, other)}
        per_record = records[other] / max(1, records[side])
        lead = min(2 * self._lead.get(side, 0), self.max_lead_records)
        return max(self.max_lead_records, math.ceil(lead * per_record))

    def _ahead(
        self, partition: int, backlog: Callable[[TopicPartition], int]
    ) -> TopicPartition | None:
        """The side of ``partition`` to keep paused, if any."""
        left, right = (self.left, partition), (self.right, partition)
        if partition in self._blind:
            if self.event_time(left) is None or self.event_time(right) is None:
                return None
            self._blind.discard(partition)
        for side, other in ((left, right), (right, left)):
            at = self._aligned_time(side)
            if backlog(other) < self.min_backlog or at is None:
                continue
            # a partner with a backlog but nothing consumed yet is behind by definition
            partner = self._aligned_time(other)
            gap = at - (partner if partner is not None else -(1 << 62))
            limit = self.slack_ms // 2 if side in self._paused else self.slack_ms
            if gap <= limit:
                continue
            budget = self._budget.get(side, self.max_lead_records)
            if budget is None or self._read_while_paused.get(side, 0) < budget:
                return side
            # the partner was read for a whole budget and is still behind: not a backlog
            # the pause can level but the two producers' clocks (or junk stamps)
            if partner is None:
                self.skews += 1
                self._blind.add(partition)
                return None
            # What most of the two windows say, not their CONFIRMING-th highest: a burst of
            # junk stamps (4 of 16 records 4 min ahead) held in the paused side's window
            # was learned as a 4-minute skew that stayed until revocation (review, 101
            # records per answer: the side then ran 1,709 requests ahead, 150 without it;
            # with one record per answer a burst still leaves one ~18 s skew).
            typical = self._typical(side) - self._typical(other)
            if typical > limit:
                self.skews += 1
                self._skew[partition] = self.skew_ms(partition) + (
                    typical if side == right else -typical
                )
            return None  # resumed either way: junk leaves the window as the side reads on
        return None

    def _labels_ahead(self, tp: TopicPartition, backlog: Callable[[TopicPartition], int]) -> bool:
        """Whether the labels' partition ``tp`` is to wait: its event time leads the least
        advanced side of its pair that still has a backlog."""
        behind = [
            side for side in ((self.left, tp[1]), (self.right, tp[1]))
            if backlog(side) >= self.min_backlog
        ]  # fmt: skip
        at = self.event_time(tp)
        if not behind or at is None:
            return False
        times = [self._aligned_time(side) for side in behind]
        if any(t is None for t in times):  # a side with a backlog and nothing read yet
            return True
        limit = self.slack_ms // 2 if tp in self._paused else self.slack_ms
        return at - min(t for t in times if t is not None) > limit

    def _typical(self, tp: TopicPartition) -> int:
        """The median of the side's recent timestamps, net of the learned skew (called only
        for a side with an event time)."""
        ordered = sorted(self._recent[tp])
        return self._net_of_skew(tp, ordered[len(ordered) // 2])
