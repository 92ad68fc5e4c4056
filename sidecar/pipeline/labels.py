"""Labels that came before any event of their request, kept a while for it.

The feedback topic and the input topics are consumed side by side, and after a
restart or a replay one can run ahead of the other: a label may be read before
its request's retrieval or final, or while the request is still open. A label
read while its request is open rides on the request (``early_label``); one
read before any of its events waits here, bounded in count and age, and is
applied when its request is decided. One that its request never claims (the
request was decided before this instance started, went to another instance,
or never came) is counted unmatched when it leaves, never kept for ever.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from sidecar.contracts.events import FeedbackEvent

__all__ = ["MAX_WAITING_LABELS", "WaitingLabels"]

MAX_WAITING_LABELS: Final = 10_000
"""Labels waiting for their request at most (the oldest leaves first): 33 MB at worst
(a label with its key holds at most ~3.3 KB: request id <= 128, source <= 256 characters)."""


class WaitingLabels:
    """Labels by request key, oldest first; each leaves when claimed, when too old or for room."""

    def __init__(self, max_age_ms: float, max_entries: int = MAX_WAITING_LABELS) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_age_ms = max_age_ms
        self.max_entries = max_entries
        self._held: OrderedDict[str, tuple[FeedbackEvent, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: str, label: FeedbackEvent, now_ms: float) -> int:
        """Keep ``label`` for ``key`` (a later one replaces it); returns how many left for room."""
        self._held.pop(key, None)
        self._held[key] = (label, now_ms)
        dropped = 0
        while len(self._held) > self.max_entries:
            self._held.popitem(last=False)
            dropped += 1
        return dropped

    def take(self, key: str) -> FeedbackEvent | None:
        """The label waiting for ``key``, if any (it stops waiting)."""
        held = self._held.pop(key, None)
        return None if held is None else held[0]

    def expire(self, now_ms: float) -> int:
        """Drop the labels older than ``max_age_ms``; returns how many."""
        dropped = 0
        while self._held:
            _, (_, since) = next(iter(self._held.items()))
            if now_ms - since < self.max_age_ms:
                break
            self._held.popitem(last=False)
            dropped += 1
        return dropped
