"""Intake flow control: the work queue before the processor, and which partitions are paused.

The subscriber's handler only queues what it consumed; one task takes the
batches in order to the processor. ``IntakeControl`` keeps the consumer's
pauses equal to what two policies want together: backpressure (every assigned
partition, while the queue is full — ``pipeline/backpressure.py``) and input
alignment (the side of a co-partition that runs ahead — ``pipeline/flow.py``).
A paused consumer still polls, so its group membership and heartbeats go on
whatever the processor is doing. It also tells the join clock when the sidecar
is behind (work queued, intake paused, a backlog on any input partition), so
that the join TTL is not charged for the sidecar's own delay.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from aiokafka import ConsumerRecord
from aiokafka.errors import IllegalStateError

from guardrail_client.records import record_bytes
from sidecar.kafka.clients import TP, ConsumerPort
from sidecar.pipeline.backpressure import Backpressure, JoinClock
from sidecar.pipeline.flow import InputAligner
from sidecar.pipeline.offsets import OffsetTracker

Records = tuple[ConsumerRecord[bytes, bytes], ...]


def batch_bytes(batch: Records) -> int:
    return sum(record_bytes(r) for r in batch)


class WorkQueue:
    """Consumed batches waiting for the processor, in order; ``records`` and ``bytes``
    count what waits."""

    def __init__(self) -> None:
        self._batches: deque[tuple[Records, int]] = deque()
        self.records = 0
        self.bytes = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()

    def put(self, batch: Records) -> None:
        if batch:
            size = batch_bytes(batch)
            self._batches.append((batch, size))
            self.records += len(batch)
            self.bytes += size
            self._ready.set()

    async def get(self) -> Records:
        while not self._batches:
            self._ready.clear()
            await self._ready.wait()
        batch, size = self._batches.popleft()
        self.records -= len(batch)
        self.bytes -= size
        self._room.set()
        return batch

    async def wait_for_room(
        self, limit: int, stopping: asyncio.Event, *, max_bytes: int | None = None
    ) -> None:
        """Until at most ``limit`` records (and ``max_bytes`` bytes) wait, or the service stops."""
        while (
            self.records > limit or (max_bytes is not None and self.bytes > max_bytes)
        ) and not stopping.is_set():
            self._room.clear()
            await self._room.wait()

    def wake(self) -> None:
        """Let ``wait_for_room`` re-check (the service is stopping)."""
        self._room.set()

    def drop(self, partitions: set[TP]) -> int:
        """Forget queued records of revoked ``partitions``; returns how many."""
        kept: deque[tuple[Records, int]] = deque()
        for batch, size in self._batches:
            rest = tuple(r for r in batch if (r.topic, r.partition) not in partitions)
            if len(rest) == len(batch):
                kept.append((batch, size))
            elif rest:
                kept.append((rest, batch_bytes(rest)))
        before = self.records
        self._batches = kept
        self.records = sum(len(b) for b, _ in kept)
        self.bytes = sum(size for _, size in kept)
        self._room.set()
        return before - self.records


def measure_lag(
    consumer: ConsumerPort, assigned: Iterable[TP], tracker: OffsetTracker
) -> dict[TP, int]:
    """Records per assigned partition in Kafka that the consumer has not handed out yet
    (0 where that is not known: not fetched yet, or a position being reset)."""
    lag: dict[TP, int] = {}
    for tp in assigned:
        try:
            high = consumer.highwater(tp)
            # the consumer's position is past what it skipped without handing it out: the
            # markers that end transactions, and aborted transactions' records
            known = [p for p in (consumer.position(tp), tracker.next_offset(tp)) if p is not None]
        except (AssertionError, IllegalStateError):  # revoked meanwhile
            known = []
        lag[tp] = max(0, high - max(known)) if high is not None and known else 0
    return lag


def measure_uncommitted(
    consumer: ConsumerPort, assigned: Iterable[TP], tracker: OffsetTracker
) -> dict[TP, int]:
    """Records per assigned partition from the offset a commit would carry now (the oldest
    record not finished: queued, in the processor, or waiting for its confirmation) to
    the partition's end as the last fetch saw it: what a consumer-group lag reads, less
    what is finished and not committed yet. ``guardrail.consumer.lag`` reports it (audit:
    the records read but not finished were left out, so it read 0 against a real lag of
    2,836 under backpressure). A paused partition's end is as of its last fetch."""
    lag: dict[TP, int] = {}
    for tp in assigned:
        try:
            high = consumer.highwater(tp)
            start = tracker.low_water(tp)
            if start is None:
                start = consumer.position(tp)
        except (AssertionError, IllegalStateError):  # revoked meanwhile
            continue
        if high is not None and start is not None:
            lag[tp] = max(0, high - start)
    return lag


class IntakeControl:
    """Applies backpressure and alignment to the consumer; keeps the join clock honest."""

    def __init__(
        self, backpressure: Backpressure, aligner: InputAligner | None, clock: JoinClock
    ) -> None:
        self.backpressure = backpressure
        self.aligner = aligner
        self.clock = clock
        self.paused: set[TP] = set()  # what this service has paused on the consumer
        self.lag: dict[TP, int] = {}  # as last measured
        # records of the batch in hand that its parts have not reached yet: read and not
        # worked on, as queued ones are (a part's join time is not charged for the ones
        # before it: 50 of 60 requests of a backlog came out incomplete at a 1 s TTL)
        self.in_hand = 0

    def on_queue(
        self,
        queued: int,
        consumer: ConsumerPort,
        assigned: set[TP],
        now_ms: float,
        queued_bytes: int = 0,
    ) -> None:
        """The queue changed: pause or resume intake if backpressure says so."""
        if self.backpressure.decide(queued, queued_bytes) is not None:
            self.apply(consumer, assigned)
        self.clock.set_behind(self._behind(queued), now_ms)

    def align(
        self,
        consumer: ConsumerPort,
        assigned: set[TP],
        lag: dict[TP, int],
        queued: int,
        now_ms: float,
        *,
        queued_bytes: int = 0,
    ) -> None:
        """Fresh lag: let the aligner decide, apply, and book whether the sidecar is behind.

        Backpressure is decided again too: a queue emptied by a revocation changes no
        record's arrival, so the pause it held would else outlive it, over partitions
        assigned since, with nothing queued to lift it (audit: a replica stopped reading
        for good after a rebalance under load, and stayed ready).
        """
        self.lag = lag
        self.backpressure.decide(queued, queued_bytes)
        if self.aligner is not None:
            self.aligner.decide(assigned, lambda tp: lag.get(tp, 0))
        self.apply(consumer, assigned)
        self.clock.set_behind(self._behind(queued), now_ms)

    def apply(self, consumer: ConsumerPort, assigned: set[TP]) -> None:
        """Make the consumer's pauses what the two policies want now."""
        want = set(assigned) if self.backpressure.paused else set()
        if self.aligner is not None:
            want |= self.aligner.paused & assigned
        self.paused &= assigned  # a revoked partition is forgotten by the consumer too
        if pause := want - self.paused:
            consumer.pause(pause)
        if resume := self.paused - want:
            consumer.resume(resume)
        self.paused = want

    def forget(self, revoked: set[TP]) -> None:
        self.paused -= revoked
        for tp in revoked:
            self.lag.pop(tp, None)
        if self.aligner is not None:
            self.aligner.forget(revoked)

    def _behind(self, queued: int) -> bool:
        return (
            queued > 0
            or self.in_hand > 0
            or self.backpressure.paused
            or any(v > 0 for v in self.lag.values())
        )
