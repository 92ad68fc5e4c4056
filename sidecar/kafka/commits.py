"""Committing consumed offsets: the low-water mark of unfinished inputs, with a handover.

Every consumed offset is pending (``OffsetTracker``) until the outputs it
contributes to are confirmed by the broker; a partition's commit is its
low-water mark. A crash therefore re-reads whatever was not published yet: a
verdict comes once or twice, never zero times.

Each input partition number's joined topics are committed together, from one
snapshot, with a handover in their metadata (``sidecar/kafka/handover.py``): the
records above the mark this owner already finished, which the next owner skips,
so that no decided request comes back as a half. The handover is committed again
whenever it changes, not only when the mark moves (a request held open for its
TTL held the mark, and with it the handover, back: audit). A partition taken with
a handover passes on what of it this owner has not read yet.

When a handover does not fit the metadata limit, a partition number that never
had one falls back to a cut lowered until no request straddles it
(``sidecar/kafka/cut.py``; ``fallbacks``): correct, but it can stand still under
steady traffic. One that had a handover keeps its last commit instead
(``holds``): the key index forgets the keys below a handover's mark, so a
lowered cut from there could tear a request apart (audit).
"""

from __future__ import annotations

import asyncio

from sidecar.kafka.clients import TP, ConsumerPort
from sidecar.kafka.cut import KeyIndex
from sidecar.kafka.handover import Handover, encode
from sidecar.kafka.readiness import LoopState
from sidecar.pipeline.offsets import OffsetTracker


class Committer:
    """Commits what changed (a mark or a handover), one commit at a time."""

    def __init__(
        self,
        tracker: OffsetTracker,
        keys: KeyIndex,
        state: LoopState,
        inherited: dict[TP, Handover] | None = None,
    ) -> None:
        """``inherited``: the handovers partitions were assigned with, while they are still
        being read (the service's, dropped as reading passes their horizons)."""
        self.tracker = tracker
        self.keys = keys
        self.state = state
        self.inherited = inherited if inherited is not None else {}
        self._lock = asyncio.Lock()
        self._metadata: dict[TP, str] = {}  # what the last commit of each partition carried
        self._inflight: asyncio.Task[None] | None = None  # the commit being sent
        self._abandoned = False  # ``abandon`` cancelled it
        self.fallbacks = 0  # partition numbers committed at a lowered cut (no handover fitted)
        self.holds = 0  # commits left out: a handover did not fit where one was committed

    def assigned_with(self, tp: TP, offset: int, metadata: str) -> None:
        """The commit a partition was assigned with (its offset and metadata): a handover
        there means no lowered cut may be committed after it."""
        self.state.last_committed[tp] = offset
        self._metadata[tp] = metadata

    async def commit(self, consumer: ConsumerPort, only: set[TP] | None = None) -> dict[TP, int]:
        """Commit, for every partition whose mark or handover changed (of ``only``, if
        given), its low-water mark and handover; returns the offsets committed."""
        async with self._lock:
            # every partition's mark (the handover may change while the mark stands); a
            # partner not read yet has none and keeps its last commit
            low = self.tracker.marks()
            if only is not None:
                low = {tp: off for tp, off in low.items() if tp in only}
            if not low:
                return {}
            plan = self._plan(low)
            if plan and not await self._send(consumer, plan):
                return {}
            self.tracker.mark_committed(low)
            offsets = {tp: off for tp, (off, _) in plan.items()}
            self.keys.committed(offsets)
            if plan:
                self.state.commits += 1
                self.state.last_committed.update(offsets)
                self._metadata.update({tp: meta for tp, (_, meta) in plan.items()})
            return offsets

    async def _send(self, consumer: ConsumerPort, plan: dict[TP, tuple[int, str]]) -> bool:
        """Send the commit; False if ``abandon`` cancelled it meanwhile."""
        self._abandoned = False
        sending = asyncio.create_task(  # noqa: RUF006 - kept in self._inflight, awaited below
            consumer.commit(
                {tp: off for tp, (off, _) in plan.items()},
                {tp: meta for tp, (_, meta) in plan.items()},
            ),
            name="sidecar-commit",
        )
        self._inflight = sending
        try:
            await sending
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not self._abandoned or (current is not None and current.cancelling()):
                raise
            return False
        finally:
            self._inflight = None
        return True

    def abandon(self) -> None:
        """Cancel the commit being sent: a topic in it was deleted. aiokafka retries a commit
        to a missing topic until the topic is back, and this one would then carry the old
        topic's offsets onto the new one; the loop's ticks waited for it all along."""
        if self._inflight is not None and not self._inflight.done():
            self._abandoned = True
            self._inflight.cancel()

    def _plan(self, low: dict[TP, int]) -> dict[TP, tuple[int, str]]:
        """Offset and metadata per partition to commit: each joined partition number whole,
        with handovers from one snapshot, or at the lowered cut; unchanged ones left out."""
        joined = self.keys.joined
        plan: dict[TP, tuple[int, str]] = {
            tp: (mark, "") for tp, mark in low.items() if tp[0] not in joined
        }
        for number in sorted({p for (t, p) in low if t in joined}):
            marks = {(t, number): low[(t, number)] for t in joined if (t, number) in low}
            handovers = {
                tp: encode(
                    mark,
                    self.tracker.next_offset(tp) or mark,
                    self.tracker.pending_offsets(tp),
                    self.inherited.get(tp),
                )
                for tp, mark in marks.items()
            }
            if all(meta is not None for meta in handovers.values()):
                whole = {tp: (marks[tp], handovers[tp] or "") for tp in marks}
            elif any(self._metadata.get((t, number)) for t in joined):
                self.holds += 1  # the last commit (a handover) stands: still consistent
                continue
            else:
                self.fallbacks += 1
                whole = {tp: (off, "") for tp, off in self.keys.cut(marks).items()}
            if any(self._last(tp) != at for tp, at in whole.items()):
                plan.update(whole)  # the partition number's topics together, or not at all
        return {tp: at for tp, at in plan.items() if tp[0] in joined or self._last(tp) != at}

    def _last(self, tp: TP) -> tuple[int | None, str]:
        return self.state.last_committed.get(tp), self._metadata.get(tp, "")

    def forget(self, revoked: set[TP]) -> None:
        self.tracker.forget(revoked)
        self.keys.forget(revoked)
        for tp in revoked:
            self.state.last_committed.pop(tp, None)
            self._metadata.pop(tp, None)
