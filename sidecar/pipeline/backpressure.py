"""Backpressure on the work queue, and a join clock that stands still while the sidecar is behind.

When the claim verifier (or any stage) is slower than the input, consumed
records wait in the adapter's work queue. :class:`Backpressure` decides when to
stop fetching: at ``depth`` queued records, or ``max_bytes`` queued bytes, it
says pause, and once the queue has drained to ``resume_at`` records (half the
depth by default) and half the bytes it says resume. The hysteresis keeps the
consumer from flapping on every batch.

:class:`JoinClock` is the clock the join's TTL is charged on. It advances with
the monotonic clock only while the sidecar keeps up — nothing queued, intake not
paused, no backlog on any input partition — and stands still while the sidecar
itself is behind. A request whose other half is already in Kafka, behind work
the sidecar has not got to, therefore never expires as ``incomplete`` because
the sidecar was slow; a half whose partner is truly missing still expires once
the sidecar has caught up and the TTL has passed. Memory stays bounded while
the clock stands still: the queue by ``depth``, the join store by its entry and
byte limits.

Pure bookkeeping, no Kafka: the service applies the decisions with
``pause`` / ``resume`` on its consumer.
"""

from __future__ import annotations

import enum

__all__ = ["Backpressure", "Flow", "JoinClock"]


class Flow(enum.Enum):
    """A change of the intake: stop fetching, or fetch again."""

    PAUSE = "pause"
    RESUME = "resume"


class Backpressure:
    """Pause intake at ``depth`` queued records or ``max_bytes`` queued bytes; resume once at
    most ``resume_at`` records and half ``max_bytes`` are left."""

    def __init__(
        self, depth: int, resume_at: int | None = None, *, max_bytes: int | None = None
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        resume_at = depth // 2 if resume_at is None else resume_at
        if not 0 <= resume_at < depth:
            raise ValueError(f"resume_at must be in [0, depth={depth}), got {resume_at}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.depth = depth
        self.resume_at = resume_at
        self.max_bytes = max_bytes
        self.paused = False
        self.pauses = 0  # how many times intake was paused (a counter for telemetry)

    def decide(self, queued: int, queued_bytes: int = 0) -> Flow | None:
        """The change to make now that ``queued`` records (``queued_bytes``) wait, if any."""
        limit = self.max_bytes
        if not self.paused and (queued >= self.depth or (limit and queued_bytes >= limit)):
            self.paused = True
            self.pauses += 1
            return Flow.PAUSE
        if self.paused and queued <= self.resume_at and (not limit or queued_bytes <= limit // 2):
            self.paused = False
            return Flow.RESUME
        return None


class JoinClock:
    """Monotonic milliseconds that pass only while the sidecar keeps up with its input."""

    def __init__(self, now_ms: float) -> None:
        self._last = now_ms
        self._value = now_ms
        self._behind = False
        self.held_ms = 0.0  # time the clock stood still (the sidecar was behind), in total

    @property
    def behind(self) -> bool:
        return self._behind

    def read(self, now_ms: float) -> float:
        """The join time at monotonic ``now_ms`` (never decreasing)."""
        elapsed = max(0.0, now_ms - self._last)
        self._last = max(self._last, now_ms)
        if self._behind:
            self.held_ms += elapsed
        else:
            self._value += elapsed
        return self._value

    def set_behind(self, behind: bool, now_ms: float) -> None:
        """From ``now_ms`` on the sidecar is (``True``) or is not behind its input."""
        self.read(now_ms)
        self._behind = behind
