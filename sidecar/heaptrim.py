"""Free heap pages handed back to the kernel now and then (``GUARDRAIL_HEAP_TRIM_INTERVAL_S``).

In a long hostile soak (``guardrail chaos --soak``) the sidecar's RSS rose about 1 MB a
minute after the sixth minute (112 -> 145 MB in 15 minutes) while the Python objects it
held stayed flat (``tracemalloc``: 46-49 MB traced from minute 4 to 14): the growth was
the C allocator's. Objects over 512 bytes (records, verdict bytes, dict tables) come from
glibc's ``malloc``; requests, the windows that outlive them and (until the fix in
``pipeline/intake.py``'s ``Rejected``) refused records' batches waiting for the cyclic
collector interleave in its heap, and the free space between live chunks grew. In-process,
400,000 requests: ``mallinfo2`` in use 31-36 MB throughout, free 3.4 -> 15.8 MB, RSS
118 -> 139 MB. ``malloc_trim(0)`` gives the free pages inside the heap back to the kernel
(``madvise``), not only its top: with it every 20,000 requests the same run held
121-127 MB from the 60,000th request on, each call 0.3-1.7 ms. In the soak, trimming alone
only lowered the minutes it ran in (145.1 -> 142.5 MB at the end); the refused-record fix
took it to 116.7 (``bench/results/soak-15min-hostile-*.json``).

Where the C library has no ``malloc_trim`` (musl, macOS) this does nothing, and says
so once at DEBUG.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HeapTrim", "Trimmed", "rss_bytes"]

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """This process's resident set, in bytes (``None`` without ``/proc``)."""
    try:
        return int(Path("/proc/self/statm").read_bytes().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where the C library has none.

    Looked up among the symbols the process has loaded already: ``ctypes.util.find_library``
    ran ``ldconfig -p`` in a subprocess at every start for the same answer."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


@dataclass(frozen=True, slots=True)
class Trimmed:
    """One trim: the RSS before and after (bytes; ``None`` without ``/proc``) and its time."""

    rss_before: int | None
    rss_after: int | None
    seconds: float

    @property
    def released(self) -> int:
        """Bytes the RSS went down by (0 when unknown or when it did not)."""
        if self.rss_before is None or self.rss_after is None:
            return 0
        return max(0, self.rss_before - self.rss_after)


class HeapTrim:
    """``malloc_trim(0)`` with the RSS around it; counts calls and bytes released."""

    def __init__(self, trim: Callable[[int], int] | None = None, *, probe: bool = True) -> None:
        """``trim``: the C call (default: glibc's, found with ctypes); ``probe=False`` with
        no ``trim``: never trims (a C library without one)."""
        self._trim = trim if trim is not None or not probe else _malloc_trim()
        self.calls = 0
        self.released_bytes = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def __call__(self) -> Trimmed | None:
        """Trim once (``None`` where the C library cannot)."""
        if self._trim is None:
            return None
        before = rss_bytes()
        start = time.perf_counter()
        self._trim(0)
        spent = time.perf_counter() - start
        done = Trimmed(before, rss_bytes(), spent)
        self.calls += 1
        self.released_bytes += done.released
        return done
