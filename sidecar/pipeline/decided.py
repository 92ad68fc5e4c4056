"""Recently decided request keys, 12 bytes each: late events never reopen a request.

A decided request's key is remembered for ``memory_ms`` (``GUARDRAIL_JOIN__DECIDED_MEMORY_MS``,
10 minutes) so that a late or re-sent event is dead-lettered (``after-final``) instead of
opening the request again and getting it a second, ``incomplete`` verdict. The keys were
an ``OrderedDict`` of strings (~200 bytes each) capped at 200,000: at 5,000 answers/s that
is 40 s, not 10 minutes, and a straggler after it reopened its request (helper-15: every
one of 3,000 trickling streams decided twice).

Here the newest keys sit in a dict of 64-bit digests, and every ``SEAL_EVERY`` of them are
merged into two sorted arrays (digest, closed-at second): 12 bytes a key, so the default
``DECIDED_MAX_ENTRIES`` (3,000,000: 10 minutes at 5,000 answers/s) holds at most ~36 MB,
about what 200,000 strings held. A lookup is a dict probe, then a 2 MB bit filter of the
sealed digests (16 % full at 3,000,000: most new keys stop there), then one binary search
(~0.3 us for a new key, ~2.8 us without the filter; a dict of strings took 0.15). The
digest is Python's string hash (64 bits, per process): two keys collide with probability
~n / 2^64 per lookup (1.6e-13 at 3,000,000 keys); a collision dead-letters one new
request's event as ``after-final``.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["SEAL_EVERY", "DecidedKeys"]

SEAL_EVERY: Final = 65_536
_MASK: Final = (1 << 64) - 1
_FILTER_BITS: Final = 24  # a 2 MB filter: one bit per low-24-bit digest value
_FILTER_MASK: Final = (1 << _FILTER_BITS) - 1


def _digest(key: str) -> int:
    return hash(key) & _MASK


class DecidedKeys:
    """Keys decided within ``memory_ms`` (at most ``max_entries``, the oldest leave first)."""

    def __init__(self, memory_ms: float, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.memory_ms = memory_ms
        self.max_entries = max_entries
        self._recent: dict[int, float] = {}  # digest -> closed at (ms), in closing order
        self._keys: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)  # sorted
        self._at_s: npt.NDArray[np.uint32] = np.empty(0, dtype=np.uint32)  # closed at (s)
        self._filter = bytearray()  # bit (digest & _FILTER_MASK) set for every sealed digest
        self._stale = 0  # keys dropped since the filter was made (their bits stay set)

    def __len__(self) -> int:
        """Keys held (a key closed twice, or expired but not dropped yet, may count twice)."""
        return len(self._recent) + int(self._keys.size)

    @property
    def nbytes(self) -> int:
        """The sealed arrays' bytes (the recent dict holds at most SEAL_EVERY keys besides)."""
        return int(self._keys.nbytes + self._at_s.nbytes) + len(self._filter)

    def add(self, key: str, now_ms: float) -> None:
        digest = _digest(key)
        self._recent.pop(digest, None)
        self._recent[digest] = now_ms
        if len(self._recent) >= min(SEAL_EVERY, self.max_entries):
            self._seal(now_ms)

    def contains(self, key: str, now_ms: float) -> bool:
        """Was ``key`` decided within ``memory_ms`` of ``now_ms``?"""
        digest = _digest(key)
        closed_ms = self._recent.get(digest)
        low = digest & _FILTER_MASK
        if closed_ms is None and self._filter and self._filter[low >> 3] & (1 << (low & 7)):
            at = int(np.searchsorted(self._keys, np.uint64(digest)))
            if at < self._keys.size and int(self._keys[at]) == digest:
                closed_ms = float(self._at_s[at]) * 1000.0
        return closed_ms is not None and now_ms - closed_ms <= self.memory_ms

    def expire(self, now_ms: float) -> None:
        """Forget the recent keys older than ``memory_ms`` (the sealed ones go at the next
        seal; a lookup already ignores them)."""
        recent = self._recent
        while recent:
            digest, closed_ms = next(iter(recent.items()))
            if now_ms - closed_ms <= self.memory_ms:
                break
            del recent[digest]
        if self._keys.size and not recent and self._expired_share(now_ms) > 0.5:
            self._seal(now_ms)  # a quiet period: most sealed keys are stale, give them back

    def _expired_share(self, now_ms: float) -> float:
        oldest_kept_s = (now_ms - self.memory_ms) / 1000.0
        return float(np.count_nonzero(self._at_s < oldest_kept_s)) / float(self._keys.size)

    def _seal(self, now_ms: float) -> None:
        """Merge the recent keys into the sorted arrays (a key closed again keeps its latest
        time); drop the expired and, past ``max_entries``, the oldest. Linear in the
        arrays (~20 ms at 3,000,000 keys): no sort of the whole."""
        recent, self._recent = self._recent, {}
        fresh = np.fromiter(recent, np.uint64, len(recent))
        seconds = np.fromiter((ms / 1000.0 for ms in recent.values()), np.float64, len(recent))
        fresh_at = np.floor(np.maximum(seconds, 0.0)).astype(np.uint32)
        order = np.argsort(fresh)
        fresh, fresh_at = fresh[order], fresh_at[order]
        keys, at_s = self._keys, self._at_s
        pos = np.searchsorted(keys, fresh)
        if keys.size:
            again = keys[np.minimum(pos, keys.size - 1)] == fresh
            at_s[pos[again]] = fresh_at[again]  # closed again: its latest time
            new = ~again
            fresh, fresh_at, pos = fresh[new], fresh_at[new], pos[new]
        keys, at_s = np.insert(keys, pos, fresh), np.insert(at_s, pos, fresh_at)
        self._mark(fresh)
        keep = at_s >= np.floor((now_ms - self.memory_ms) / 1000.0)
        excess = int(np.count_nonzero(keep)) - self.max_entries
        if excess > 0:  # the oldest leave first
            keep &= at_s >= np.partition(at_s[keep], excess)[excess]
        if not keep.all():
            keys, at_s = keys[keep], at_s[keep]
            self._stale += int(keep.size - keys.size)
        self._keys, self._at_s = keys, at_s
        if self._stale > keys.size // 4:  # bits of dropped keys: lookups that search in vain
            self._stale = 0
            if keys.size:
                bits = np.zeros(1 << _FILTER_BITS, dtype=bool)  # 16 MB while it is packed
                bits[(keys & np.uint64(_FILTER_MASK)).astype(np.int64)] = True
                self._filter = bytearray(np.packbits(bits, bitorder="little").tobytes())
            else:
                self._filter = bytearray()

    def _mark(self, digests: npt.NDArray[np.uint64]) -> None:
        """Set the filter bits of ``digests`` (the filter is made on first use)."""
        if not digests.size:
            return
        if not self._filter:
            self._filter = bytearray(1 << (_FILTER_BITS - 3))
        low = (digests & np.uint64(_FILTER_MASK)).astype(np.int64)
        view = np.frombuffer(self._filter, dtype=np.uint8)
        np.bitwise_or.at(view, low >> 3, np.left_shift(1, low & 7).astype(np.uint8))
