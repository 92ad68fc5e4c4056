"""The bounded store that joins the two halves of a request by ``request_id``.

Bounded twice: at most ``max_entries`` open requests (the oldest is evicted to
make room) and at most ``ttl_ms`` from a request's first event to its
completion (expired ones are swept). Evicted half-requests are returned to the
caller, which turns them into ``block`` / ``incomplete`` verdicts, so nothing
is dropped silently. A short memory of completed request ids catches events
that arrive after their request was decided.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.contracts.events import GenerationFinal, RetrievalEvent, RetrievalSignal

if TYPE_CHECKING:
    from sidecar.pipeline.ports import ClaimResult, ClaimSession


@dataclass(frozen=True, slots=True)
class InputRef:
    """Where an input message came from (enough to commit it and to trace it)."""

    topic: str
    partition: int
    offset: int
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass(slots=True)
class PendingRequest:
    """What has arrived so far for one request."""

    request_id: str
    first_seen_ms: float
    first_seen_ns: int = 0  # wall clock (epoch ns), for trace spans
    retrieval: RetrievalEvent | None = None
    retrieval_digest: bytes | None = None
    final: GenerationFinal | None = None
    final_digest: bytes | None = None
    deltas: dict[int, str] = field(default_factory=dict)
    next_seq: int = 0  # deltas 0..next_seq-1 are contiguous and appended to ``streamed``
    streamed: str = ""
    refs: list[InputRef] = field(default_factory=list)
    raws: list[tuple[bytes | None, bytes]] = field(default_factory=list)  # (key, value) per ref
    certification: RetrievalSignal | None = None
    claims: ClaimSession | None = None
    claims_fed: int = 0  # characters of ``streamed`` already given to ``claims``
    claims_published: int = 0
    claim_results: list[ClaimResult] = field(default_factory=list)
    stream_blocked: bool = False
    stages: list[tuple[str, int, int]] = field(default_factory=list)  # (stage, start_ns, end_ns)

    def trace_parent(self) -> tuple[tuple[str, bytes], ...]:
        """Headers carrying the LLM service's trace context: the final's, else any input's."""
        carriers = [
            ref.headers for ref in self.refs if any(k == "traceparent" for k, _ in ref.headers)
        ]
        return carriers[-1] if carriers else ()

    @property
    def complete(self) -> bool:
        return self.retrieval is not None and self.final is not None

    def add_delta(self, seq: int, text: str) -> str:
        """Store a delta; returns the newly contiguous text (may be empty)."""
        self.deltas[seq] = text
        grown: list[str] = []
        while self.next_seq in self.deltas:
            grown.append(self.deltas[self.next_seq])
            self.next_seq += 1
        new_text = "".join(grown)
        self.streamed += new_text
        return new_text

    def missing(self) -> list[str]:
        return [
            name
            for name, part in (("retrieval", self.retrieval), ("generation.final", self.final))
            if part is None
        ]


class JoinStore:
    """Open requests in first-seen order, plus recently completed ids."""

    def __init__(self, max_entries: int, ttl_ms: float) -> None:
        self.max_entries = max_entries
        self.ttl_ms = ttl_ms
        self._open: OrderedDict[str, PendingRequest] = OrderedDict()
        self._done: OrderedDict[str, float] = OrderedDict()
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return len(self._open)

    def get(self, request_id: str) -> PendingRequest | None:
        return self._open.get(request_id)

    def open(self, request_id: str, now_ms: float) -> tuple[PendingRequest, PendingRequest | None]:
        """Return the entry for ``request_id`` (new if needed) and what was evicted for it."""
        entry = self._open.get(request_id)
        if entry is not None:
            return entry, None
        evicted = None
        if len(self._open) >= self.max_entries:
            _, evicted = self._open.popitem(last=False)
            self.evictions += 1
        entry = PendingRequest(
            request_id=request_id, first_seen_ms=now_ms, first_seen_ns=time.time_ns()
        )
        self._open[request_id] = entry
        return entry, evicted

    def discard(self, request_id: str) -> None:
        """Forget an open request without remembering it as decided."""
        self._open.pop(request_id, None)

    def close(self, request_id: str, now_ms: float) -> PendingRequest | None:
        """Remove a request (it has been decided) and remember that it was."""
        entry = self._open.pop(request_id, None)
        self._done[request_id] = now_ms
        self._done.move_to_end(request_id)
        while len(self._done) > self.max_entries:
            self._done.popitem(last=False)
        return entry

    def was_closed(self, request_id: str, now_ms: float) -> bool:
        closed_at = self._done.get(request_id)
        return closed_at is not None and now_ms - closed_at <= self.ttl_ms

    def expire(self, now_ms: float) -> list[PendingRequest]:
        """Remove and return every open request older than the TTL."""
        expired: list[PendingRequest] = []
        while self._open:
            request_id, entry = next(iter(self._open.items()))
            if now_ms - entry.first_seen_ms < self.ttl_ms:
                break
            del self._open[request_id]
            expired.append(entry)
        self.expirations += len(expired)
        while self._done:
            request_id, closed_at = next(iter(self._done.items()))
            if now_ms - closed_at <= self.ttl_ms:
                break
            del self._done[request_id]
        return expired

    def drop_partitions(self, partitions: set[tuple[str, int]]) -> int:
        """Forget open requests with any input on revoked partitions; returns how many."""
        doomed = [
            rid
            for rid, entry in self._open.items()
            if any(ref.tp in partitions for ref in entry.refs)
        ]
        for rid in doomed:
            del self._open[rid]
        return len(doomed)

    def drain(self) -> list[PendingRequest]:
        """Remove and return all open requests (shutdown)."""
        entries = list(self._open.values())
        self._open.clear()
        return entries
