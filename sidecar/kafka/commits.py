"""Committing consumed offsets: the low-water mark of unfinished inputs, cut so no request is torn.

Every consumed offset is pending (``OffsetTracker``) until the outputs it
contributes to are confirmed by the broker; a partition's commit is its
low-water mark, lowered to a cut that tears no request apart across the joined
topics (``sidecar/kafka/cut.py``). A crash therefore re-reads whatever was not
published yet: a verdict comes once or twice, never zero times.
"""

from __future__ import annotations

import asyncio

from sidecar.kafka.clients import TP, ConsumerPort
from sidecar.kafka.cut import KeyIndex
from sidecar.kafka.readiness import LoopState
from sidecar.pipeline.offsets import OffsetTracker


class Committer:
    """Commits what moved, one commit at a time."""

    def __init__(self, tracker: OffsetTracker, keys: KeyIndex, state: LoopState) -> None:
        self.tracker = tracker
        self.keys = keys
        self.state = state
        self._lock = asyncio.Lock()

    async def commit(self, consumer: ConsumerPort, only: set[TP] | None = None) -> dict[TP, int]:
        """Commit, for every partition that moved (of ``only``, if given), its cut low-water."""
        async with self._lock:
            moved = self.tracker.committable()
            if only is not None:
                moved = {tp: off for tp, off in moved.items() if tp in only}
            if not moved:
                return {}
            low = {
                tp: mark
                for tp in self.keys.partners(moved)
                if (only is None or tp in only) and (mark := self.tracker.low_water(tp)) is not None
            }
            offsets = {
                tp: off
                for tp, off in self.keys.cut(low).items()
                if self.state.last_committed.get(tp) != off
            }
            if offsets:
                await consumer.commit(offsets)
            self.tracker.mark_committed(moved)
            self.keys.committed(offsets)
            if offsets:
                self.state.commits += 1
                self.state.last_committed.update(offsets)
            return offsets

    def forget(self, revoked: set[TP]) -> None:
        self.tracker.forget(revoked)
        self.keys.forget(revoked)
        for tp in revoked:
            self.state.last_committed.pop(tp, None)
