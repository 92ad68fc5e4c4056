"""What a partition's next owner may skip: the records this owner finished above its commit.

A partition's commit is its low-water mark, the oldest record still pending (a
request held open, a verdict not confirmed yet). Above it lie records already
finished: decided requests' events, dead letters. Whoever reads the partition next
(a rebalance, a restart, a crash) starts at the mark and would read them again,
and a decided request that started below the mark of one input topic and ended
above the other's would come back as a half: ``incomplete``, a second verdict that
contradicts the first. Lowering the marks until no request straddles them
(:mod:`sidecar.kafka.cut`) avoids that, but under steady streaming traffic every
request overlaps an earlier one, so the marks fell back to the last idle moment
and stayed there (audit: the committed offset stood still while traffic flowed;
the lag grew by ~800 records a second, and a restart 50 s in decided 9,000
requests again).

So each commit says, in its offset metadata, which records from the mark up to
where this owner had read are still pending: ``h1:<mark>:<horizon - mark>:<ranges>``
(base 36; ranges ``a`` or ``a-b``, inclusive, relative to the mark). The next
owner reads the metadata when it is assigned the partition and skips every
record in ``[mark, horizon)`` that is not listed: exactly the records the last
owner finished. The two input topics of a partition number are committed together,
from one snapshot, so a request is skipped on both or read again on both.
Metadata that does not fit the broker's limit (``offset.metadata.max.bytes``,
4,096 by default) is not written: the commit then falls back to the lowered cut.
"""

from __future__ import annotations

import base64
import binascii
import logging
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["BITMAP_FORMAT", "FORMAT", "MAX_METADATA_CHARS", "Handover", "decode", "encode"]

log = logging.getLogger("sidecar.kafka")

FORMAT: Final = "h1"  # pending offsets as runs
BITMAP_FORMAT: Final = "h2"  # pending offsets as one bit per record of the span
MAX_BITMAP_BITS: Final = 22_500  # 3,750 base64 characters
MAX_METADATA_CHARS: Final = 3_800  # below the brokers' default offset.metadata.max.bytes (4,096)
_DIGITS: Final = "0123456789abcdefghijklmnopqrstuvwxyz"


def _b36(n: int) -> str:
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_DIGITS[r])
    return "".join(reversed(out))


def _runs(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted offsets as inclusive runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and offset == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def encode(
    mark: int,
    horizon: int,
    pending: Sequence[int],
    inherited: Handover | None = None,
) -> str | None:
    """The metadata of a commit at ``mark``: ``pending`` (sorted, in ``[mark, horizon)``)
    are the records the next owner must read; ``None`` when it would not fit.

    ``inherited``: the handover this owner took the partition with, while it has not read
    to its horizon (``horizon`` is how far this owner read): what the last owner left
    pending beyond that is still to be read, the rest of it is still finished, and the
    next owner gets both (audit: a second takeover before the first had read to its
    horizon lost the rest, and requests the first owner decided came back as halves).
    """
    runs = _runs(pending)
    if inherited is not None and inherited.horizon > horizon:
        runs += [(max(a, horizon), b) for a, b in inherited.pending if b >= horizon]
        horizon = inherited.horizon
    head = f"{_b36(mark)}:{_b36(horizon - mark)}"
    parts = [_b36(a - mark) if a == b else f"{_b36(a - mark)}-{_b36(b - mark)}" for a, b in runs]
    listed = f"{FORMAT}:{head}:{','.join(parts)}"
    if len(listed) <= MAX_METADATA_CHARS:
        return listed
    # a streaming answer's many deltas, interleaved with decided ones, make many short runs:
    # one bit per record of the span then says more in fewer characters (audit: at ~800
    # pending records a partition the runs no longer fit and commits stood still)
    if (horizon - mark) > MAX_BITMAP_BITS:
        return None
    bits = bytearray((horizon - mark + 7) // 8)
    for a, b in runs:
        for offset in range(a - mark, b - mark + 1):
            bits[offset >> 3] |= 1 << (offset & 7)
    mapped = f"{BITMAP_FORMAT}:{head}:{base64.urlsafe_b64encode(bits).decode().rstrip('=')}"
    return mapped if len(mapped) <= MAX_METADATA_CHARS else None


@dataclass(frozen=True, slots=True)
class Handover:
    """One partition's records the last owner finished: ``[start, horizon)`` but ``pending``."""

    start: int
    horizon: int
    pending: tuple[tuple[int, int], ...]  # inclusive runs, ascending, absolute offsets

    def finished(self, offset: int) -> bool:
        """The last owner finished this record: its next owner skips it."""
        if not self.start <= offset < self.horizon:
            return False
        i = bisect_right(self.pending, offset, key=_first) - 1  # the last run starting <= it
        return i < 0 or self.pending[i][1] < offset


def _first(run: tuple[int, int]) -> int:
    return run[0]


def _bitmap_runs(mark: int, span: int, text: str) -> list[tuple[int, int]]:
    """The pending runs of an ``h2`` bitmap (``ValueError``: not one of ``span`` bits)."""
    if span > MAX_BITMAP_BITS:
        raise ValueError("span too long for a bitmap")
    try:
        bits = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(str(exc)) from None
    if len(bits) != (span + 7) // 8:
        raise ValueError("bitmap length differs from its span")
    pending = [mark + i for i in range(span) if bits[i >> 3] >> (i & 7) & 1]
    return _runs(pending)


def decode(committed: int, metadata: str) -> Handover | None:
    """The handover a commit at ``committed`` carries (``None``: none, or not for this offset:
    metadata another tool wrote, or an offset reset since)."""
    if not metadata.startswith((FORMAT + ":", BITMAP_FORMAT + ":")):
        return None
    try:
        kind, mark_text, span_text, ranges = metadata.split(":")
        mark, span = int(mark_text, 36), int(span_text, 36)
        runs = _bitmap_runs(mark, span, ranges) if kind == BITMAP_FORMAT else []
        for part in ranges.split(",") if ranges and kind == FORMAT else ():
            a, _, b = part.partition("-")
            runs.append((mark + int(a, 36), mark + int(b or a, 36)))
    except ValueError:
        log.warning(
            "commit metadata %r is not a handover this sidecar reads: ignored", metadata[:80]
        )
        return None
    if mark != committed:  # the offset was moved by someone else since: nothing applies
        return None
    if any(b < a for a, b in runs) or any(
        runs[i][1] >= runs[i + 1][0] for i in range(len(runs) - 1)
    ):
        log.warning("commit metadata %r: its ranges are out of order: ignored", metadata[:80])
        return None
    return Handover(mark, mark + span, tuple(runs))
