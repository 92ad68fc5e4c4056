"""Keys grouped by owner (the trusted tenant), oldest first, with the largest owners at hand.

The sidecar's bounded stores make room the same way: the owner that holds the most
gives up its oldest key first, so one tenant's flood evicts its own entries and
never another tenant's (:class:`~sidecar.pipeline.labels.WaitingLabels`, the join's
:class:`~sidecar.pipeline.join.JoinStore`). Finding that owner is O(1): owners sit
in buckets by how many keys they hold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

__all__ = ["OwnedKeys"]


class OwnedKeys:
    """Each owner's keys in the order they came, and the owners holding the most."""

    def __init__(self) -> None:
        self._owned: dict[str, OrderedDict[str, None]] = {}  # owner -> its keys, oldest first
        self._by_count: dict[int, dict[str, None]] = {}  # n -> the owners holding n keys
        self._most = 0  # the largest n held by an owner

    def add(self, owner: str, key: str) -> None:
        """``key`` now belongs to ``owner`` (newest); a key given twice counts once."""
        keys = self._owned.setdefault(owner, OrderedDict())
        if key in keys:
            return
        keys[key] = None
        self._counted(owner, len(keys) - 1, len(keys))

    def remove(self, owner: str, key: str) -> None:
        """``key`` no longer belongs to ``owner`` (nothing when it did not)."""
        keys = self._owned.get(owner)
        if keys is None or key not in keys:
            return
        del keys[key]
        self._counted(owner, len(keys) + 1, len(keys))
        if not keys:
            del self._owned[owner]

    @property
    def most(self) -> int:
        """How many keys the largest owner holds (0 when none)."""
        return self._most

    def count(self, owner: str) -> int:
        keys = self._owned.get(owner)
        return 0 if keys is None else len(keys)

    def keys_of(self, owner: str) -> Iterator[str]:
        """``owner``'s keys, oldest first."""
        return iter(self._owned.get(owner, ()))

    def largest(self) -> Iterator[str]:
        """The owners holding the most keys (ties in the order they got there)."""
        return iter(self._by_count.get(self._most, ()))

    def _counted(self, owner: str, before: int, after: int) -> None:
        """``owner`` went from ``before`` to ``after`` keys (one more or one fewer)."""
        if before:
            bucket = self._by_count[before]
            del bucket[owner]
            if not bucket:
                del self._by_count[before]
        if after:
            self._by_count.setdefault(after, {})[owner] = None
        if after > self._most:
            self._most = after
        elif before == self._most and before not in self._by_count:
            self._most = after  # the one owner at the top stepped down by one
