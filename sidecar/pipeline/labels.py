"""Labels that came before any event of their request, kept a while for it.

The feedback topic and the input topics are consumed side by side, and after a
restart or a replay one can run ahead of the other: a label may be read before
its request's retrieval or final, or while the request is still open. A label
read while its request is open rides on the request (``early_label``); one
read before any of its events waits here, bounded in count and age, and is
applied when its request is decided. One that its request never claims (the
request was decided before this instance started, went to another instance,
or never came) is counted unmatched when it leaves, never kept for ever.

A label read back at an assignment (its partition came here) for a request not decided
here yet may have been waiting where it was read: it waits here too
(:meth:`WaitingLabels.hold_read_back`), in the room consumed labels leave, and is not
counted when it leaves unclaimed (it was consumed, and counted, where it was read).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from guardrail_client.keys import partition_for
from sidecar.contracts.events import FeedbackEvent
from sidecar.pipeline.owners import OwnedKeys

__all__ = ["MAX_WAITING_LABELS", "WaitingLabels"]

MAX_WAITING_LABELS: Final = 10_000
"""Labels waiting for their request at most: 33 MB at worst (a label with its key holds at
most ~3.3 KB: request id <= 128, source <= 256 characters). For room, the tenant holding
the most leaves its oldest first: one tenant's flood evicts its own labels, not another's."""


class WaitingLabels:
    """Labels by request key; each leaves when claimed, when too old (oldest first) or for
    room (the oldest of the tenant that holds the most).

    Before, one pool was shared oldest-first by every tenant: 10,001 labels from one
    tenant, for ids that never come, erased another tenant's waiting label (helper-15),
    keeping its error out of the coverage bound and the certificate re-test.
    """

    def __init__(self, max_age_ms: float, max_entries: int = MAX_WAITING_LABELS) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_age_ms = max_age_ms
        self.max_entries = max_entries
        # key -> (label, since, owner, consumed here), oldest first
        self._held: OrderedDict[str, tuple[FeedbackEvent, float, str, bool]] = OrderedDict()
        self._owners = OwnedKeys()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: str, label: FeedbackEvent, now_ms: float, owner: str = "") -> int:
        """Keep ``label`` for ``key`` (a later one replaces it), held by ``owner`` (the
        trusted tenant); returns how many consumed here left for room."""
        self._remove(key)
        self._held[key] = (label, now_ms, owner, True)
        self._owners.add(owner, key)
        dropped = 0
        while len(self._held) > self.max_entries:
            richest = next(self._owners.largest())
            gone = self._remove(next(self._owners.keys_of(richest)))
            dropped += gone is not None and gone[3]
        return dropped

    def hold_read_back(self, key: str, label: FeedbackEvent, now_ms: float, owner: str) -> bool:
        """Keep a label read back for ``key`` (not consumed here) where there is room and
        none waits for ``key``; whether it was kept."""
        if key in self._held or len(self._held) >= self.max_entries:
            return False
        self._held[key] = (label, now_ms, owner, False)
        self._owners.add(owner, key)
        return True

    def drop_homes(self, partitions: set[int], count: int) -> int:
        """Forget the labels whose request murmur2 puts on ``partitions`` (of ``count``):
        read elsewhere now, they are their new owner's to keep waiting (it reads them
        back), not counted unmatched here. Returns how many."""
        gone = [
            key
            for key, (label, *_) in self._held.items()
            if partition_for(label.request_id, count) in partitions
        ]
        for key in gone:
            self._remove(key)
        return len(gone)

    def take(self, key: str) -> FeedbackEvent | None:
        """The label waiting for ``key``, if any (it stops waiting)."""
        held = self._remove(key)
        return None if held is None else held[0]

    def expire(self, now_ms: float) -> int:
        """Drop the labels older than ``max_age_ms``; returns how many consumed here."""
        dropped = 0
        while self._held:
            key, (_, since, _, consumed) = next(iter(self._held.items()))
            if now_ms - since < self.max_age_ms:
                break
            self._remove(key)
            dropped += consumed
        return dropped

    def _remove(self, key: str) -> tuple[FeedbackEvent, float, str, bool] | None:
        held = self._held.pop(key, None)
        if held is not None:
            self._owners.remove(held[2], key)
        return held
