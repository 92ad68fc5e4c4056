"""The bounded store that joins the two halves of a request by ``request_id``.

Bounded three times: at most ``max_entries`` open requests and ``max_bytes``
of held input bytes, counting a final event's decoded attention summary beside
its raw bytes (to make room, the tenant that holds the most open requests, or
the most bytes, gives up its oldest: one tenant's flood evicts its own
requests, never another tenant's), and at most
``ttl_ms`` from a request's first event to its completion (expired ones are
swept). Evicted half-requests are returned to the caller, which turns them
into ``block`` / ``incomplete`` verdicts, so nothing is dropped silently. A
bounded memory of decided request ids (longer than the TTL) catches events that
arrive after their request was decided.

Requests are stored under a *key*: the request id, scoped by the trusted
tenant when tenancy comes from a header or is fixed, so that one tenant's
events can never join another tenant's request.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.contracts.events import (
    FeedbackEvent,
    GenerationFinal,
    RetrievalEvent,
    RetrievalSignal,
)
from sidecar.pipeline.decided import DecidedKeys
from sidecar.pipeline.owners import OwnedKeys

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sidecar.pipeline.ports import ClaimResult, ClaimSession


MAX_REFUSAL_DETAIL = 300  # characters of a refusal's detail an incomplete verdict repeats


# Names the record a rerouted copy was made of (``topic/partition/offset``): a record that
# carries it is joined where it is read, never rerouted again (the partition count changed
# in between, or a producer wrote the header itself)
REROUTED_HEADER = "x-guardrail-rerouted-from"


@dataclass(frozen=True, slots=True)
class InputRef:
    """Where an input message came from (enough to commit it and to trace it)."""

    topic: str
    partition: int
    offset: int
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = -1  # the record's Kafka timestamp (-1: none given)
    # the partition's last owner finished it (its handover): only remembered, not held
    finished: bool = False
    # the life of its topic it was read in (``OffsetTracker.incarnation``): a topic deleted
    # and created again under the same name starts over at offset 0, other records
    incarnation: int = 0
    # its topic's partition count when it was read (0: not known, as in memory): with it,
    # intake tells whether the record is on the partition its request id hashes to
    partitions: int = 0

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)


# a W3C traceparent as a propagator reads it (version-traceid-parentid-flags, ids not all
# zeros, at most 512 characters): which input's context a verdict continues
_TRACEPARENT = re.compile(
    rb"[ \t]*[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
    rb"(?:-[^\r\n]*)?[ \t]*"
)
_TRACEPARENT_MAX_BYTES = 512
MAX_TRACE_LINKS = 8  # other traces a verdict's span links to (a retrieval's, usually)


def _last_traceparent(headers: tuple[tuple[str, bytes], ...]) -> bytes | None:
    """The value a propagator reads: the last ``traceparent`` header (``None``: none)."""
    found = None
    for name, value in headers:
        if name == "traceparent":
            found = value
    return found


def _readable_parent(headers: tuple[tuple[str, bytes], ...]) -> bool:
    value = _last_traceparent(headers)
    return (
        value is not None
        and len(value) <= _TRACEPARENT_MAX_BYTES
        and _TRACEPARENT.fullmatch(value) is not None
    )


def _trace_id(headers: tuple[tuple[str, bytes], ...]) -> bytes:
    """The trace id part of the last ``traceparent`` (empty: none)."""
    value = _last_traceparent(headers)
    return value.strip()[3:35] if value else b""


@dataclass(slots=True)
class PendingRequest:
    """What has arrived so far for one request."""

    request_id: str
    first_seen_ms: float
    # monotonic ns (``time.monotonic_ns``): stages are timed from it, and a trace span's
    # wall-clock start is worked out when the span is opened (``Telemetry``)
    first_seen_ns: int = 0
    key: str = ""  # the store key (request id, scoped by the trusted tenant); "" = request_id
    tenant: str | None = None  # the trusted tenant, when tenancy is not taken from the event
    bytes_held: int = 0  # raw input bytes + decoded attention (the store's byte budget)
    request_bytes: int = 0  # what counts against max_request_bytes (a delta: its text)
    retrieval: RetrievalEvent | None = None
    retrieval_digest: bytes | None = None
    final: GenerationFinal | None = None
    final_digest: bytes | None = None
    # text; once appended, a digest (or the text, when it is a piece of ``parts`` itself)
    deltas: dict[int, str | bytes] = field(default_factory=dict)
    next_seq: int = 0  # deltas 0..next_seq-1 are contiguous and appended to the stream
    parts: list[str] = field(default_factory=list)  # the contiguous stream, piece by piece
    streamed_chars: int = 0
    held_chars: int = 0  # deltas' text held ahead of a gap in the sequence, not streamed yet
    refs: list[InputRef] = field(default_factory=list)
    # the partition numbers ``refs`` came on, each with the topic of its first input: a
    # partition check per event costs the partition count, not the request's event count
    partitions: dict[int, str] = field(default_factory=dict)
    # (topic, partition, home) of its first input read on another partition than ``home``,
    # the one murmur2 puts its request id on: its producer partitions otherwise
    misrouted: tuple[str, int, int] | None = None
    certification: RetrievalSignal | None = None
    claims: ClaimSession | None = None
    claims_refused: bool = False  # its session would outgrow the request's byte budget
    claims_bytes: int = 0  # the session's bytes, counted in bytes_held
    claims_fed: int = 0  # pieces of ``parts`` already given to ``claims``
    claims_published: int = 0
    claim_results: list[ClaimResult] = field(default_factory=list)
    stream_blocked: bool = False
    early_label: FeedbackEvent | None = None  # feedback that came before the verdict
    final_headers: tuple[tuple[str, bytes], ...] = ()  # the final event's (trace context)
    final_timestamp_ms: int = -1  # the final event's Kafka timestamp (-1: none given)
    stages: list[tuple[str, int, int]] = field(default_factory=list)  # (stage, start_ns, end_ns)
    first_record: int = 0  # the store's record count when this request opened
    # its retrieval or final dead-lettered after it was read (over a limit, a lookback
    # summary that does not fit): the first such refusal, and every half refused
    refused: tuple[str, str] | None = None  # (reason, detail)
    refused_parts: frozenset[str] = frozenset()

    def trace_parent(self) -> tuple[tuple[str, bytes], ...]:
        """Headers carrying the LLM service's trace context: the final's, else the latest
        input's. A ``traceparent`` no propagator can read is passed over for another
        input's (audit: a final's malformed one cost the verdict the retrieval's trace);
        when none can be read, the final's headers, else any input's, as they came."""
        if not self.final_headers and not self._any_headers():
            return ()  # no input carried a header (tracing off upstream): ~6 us a verdict less
        if _readable_parent(self.final_headers):
            return self.final_headers
        for ref in reversed(self.refs):
            if _readable_parent(ref.headers):
                return ref.headers
        if any(k == "traceparent" for k, _ in self.final_headers):
            return self.final_headers
        carriers = [
            ref.headers for ref in self.refs if any(k == "traceparent" for k, _ in ref.headers)
        ]
        return carriers[-1] if carriers else ()

    def trace_links(
        self, parent: tuple[tuple[str, bytes], ...]
    ) -> tuple[tuple[tuple[str, bytes], ...], ...]:
        """The inputs' trace contexts in other traces than ``parent``'s, one per trace (at
        most :data:`MAX_TRACE_LINKS`): a retrieval written under another trace than the
        answer is linked from the verdict, not only from the poll that read it."""
        if not self._any_headers():
            return ()
        traces = {_trace_id(parent)}
        links: list[tuple[tuple[str, bytes], ...]] = []
        for ref in self.refs:
            trace_id = _trace_id(ref.headers)
            if trace_id in traces or not _readable_parent(ref.headers):
                continue
            traces.add(trace_id)
            links.append(ref.headers)
            if len(links) == MAX_TRACE_LINKS:
                break
        return tuple(links)

    def _any_headers(self) -> bool:
        """Whether any input held carries a header (a plain loop: the common case has none)."""
        for ref in self.refs:
            if ref.headers:
                return True
        return False

    @property
    def complete(self) -> bool:
        return self.retrieval is not None and self.final is not None

    @property
    def store_key(self) -> str:
        return self.key or self.request_id

    def same_delta(self, seq: int, text: str) -> bool | None:
        """``None``: no delta ``seq`` held; else whether ``text`` is identical to it (the
        text itself, or the digest of an appended delta that was not a piece by itself)."""
        held = self.deltas.get(seq)
        if held is None:
            return None
        return held == text if isinstance(held, str) else held == _text_digest(text)

    def add_delta(self, seq: int, text: str) -> str:
        """Store a delta; returns the newly contiguous text (may be empty).

        Once appended to ``streamed`` a delta is kept only as a digest (for
        duplicate checks): its text is held once, not twice. A delta that is the
        stream's piece by itself (one delta grew it, the in-order case) keeps its
        text instead: the same object as the piece, no second copy, and no digest
        to make (~0.5 us a delta).
        """
        deltas = self.deltas
        deltas[seq] = text
        self.held_chars += len(text)
        first = self.next_seq
        grown: list[str] = []
        while self.next_seq in deltas:
            held = deltas[self.next_seq]
            assert isinstance(held, str)  # noqa: S101 - only not-yet-appended deltas are text
            grown.append(held)
            self.held_chars -= len(held)
            self.next_seq += 1
        if len(grown) == 1:
            new_text = grown[0]  # the piece itself, held in ``deltas`` and ``parts`` at once
        else:
            for appended in range(first, self.next_seq):
                deltas[appended] = _text_digest(grown[appended - first])
            new_text = "".join(grown)
        if new_text:  # pieces, not one growing string: appending stays linear
            self.parts.append(new_text)
            self.streamed_chars += len(new_text)
        return new_text

    @property
    def streamed(self) -> str:
        """The contiguous streamed text so far."""
        return "".join(self.parts)

    def take_unfed(self) -> str:
        """Streamed text not yet given to the claim checker (and mark it given)."""
        new_text = "".join(self.parts[self.claims_fed :])
        self.claims_fed = len(self.parts)
        return new_text

    def refuse(self, part: str, reason: str, detail: str) -> None:
        """``part`` (``retrieval`` / ``generation.final``) was dead-lettered: it may still
        come again (a producer's corrected re-send), else the request cannot complete. A
        refused second copy of a part it holds changes nothing."""
        if part not in self.missing():
            return
        self.refused = self.refused or (reason, detail[:MAX_REFUSAL_DETAIL])
        self.refused_parts |= {part}

    @property
    def cannot_complete(self) -> bool:
        """Every half it misses was dead-lettered: decided ``incomplete`` now, not at the TTL."""
        return self.refused is not None and set(self.missing()) <= self.refused_parts

    def missing(self) -> list[str]:
        return [
            name
            for name, part in (("retrieval", self.retrieval), ("generation.final", self.final))
            if part is None
        ]


def _text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class JoinStore:
    """Open requests in first-seen order, plus recently decided keys."""

    def __init__(
        self,
        max_entries: int,
        ttl_ms: float,
        *,
        max_bytes: int | None = None,
        decided_memory_ms: float | None = None,
        decided_max_entries: int | None = None,
        max_records_behind: int | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.max_records_behind = max_records_behind
        self.records = 0  # input records admitted so far (``note_record``)
        self.backlog_evictions = 0
        self.ttl_ms = ttl_ms
        self.max_bytes = max_bytes
        self.decided_memory_ms = max(decided_memory_ms or ttl_ms, ttl_ms)
        self.decided_max_entries = max(decided_max_entries or max_entries, max_entries)
        self._open: OrderedDict[str, PendingRequest] = OrderedDict()
        self._owners = OwnedKeys()  # open keys by trusted tenant ("" when events name it)
        self._owner_bytes: dict[str, int] = {}
        self._done = DecidedKeys(self.decided_memory_ms, self.decided_max_entries)
        self.bytes_held = 0
        self.evictions = 0
        self.byte_evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return len(self._open)

    def get(self, key: str) -> PendingRequest | None:
        return self._open.get(key)

    def open(
        self,
        key: str,
        now_ms: float,
        *,
        request_id: str | None = None,
        tenant: str | None = None,
    ) -> PendingRequest:
        """The entry for ``key`` (new if needed). A new one may take the store past
        ``max_entries`` until :meth:`make_room`: an event that is then refused must
        not have cost another request its place."""
        entry = self._open.get(key)
        if entry is not None:
            return entry
        entry = PendingRequest(
            request_id=request_id or key,
            first_seen_ms=now_ms,
            first_seen_ns=time.monotonic_ns(),
            key=key,
            tenant=tenant,
            first_record=self.records,
        )
        self._open[key] = entry
        self._owners.add(_owner(entry), key)
        return entry

    def make_room(self, entry: PendingRequest) -> list[PendingRequest]:
        """Evict for ``entry`` (held now) while more than ``max_entries`` requests are
        open: the oldest of the tenant with the most open requests each time."""
        evicted: list[PendingRequest] = []
        while len(self._open) > self.max_entries:
            victim = self._oldest_of(self._owners.largest(), entry)
            if victim is None:
                break
            evicted.append(victim)
        self.evictions += len(evicted)
        return evicted

    def _oldest_of(self, owners: Iterable[str], spare: PendingRequest) -> PendingRequest | None:
        """Remove and return the oldest open request of the first of ``owners`` that holds
        one other than ``spare``."""
        for owner in owners:
            for key in self._owners.keys_of(owner):
                if key != spare.key:
                    return self._remove(key)
        return None

    def note_record(self) -> None:
        """One more input record was read (held, duplicate or dead-lettered)."""
        self.records += 1

    def behind(self) -> list[PendingRequest]:
        """Remove and return the open requests opened more than ``max_records_behind``
        records ago: each holds its partitions' commit, and every later record, back."""
        out: list[PendingRequest] = []
        limit = self.max_records_behind
        while limit is not None and self._open:
            entry = next(iter(self._open.values()))
            if self.records - entry.first_record <= limit:
                break
            out.append(self._pop_oldest())
        self.backlog_evictions += len(out)
        return out

    def hold_bytes(self, entry: PendingRequest, size: int) -> list[PendingRequest]:
        """Account ``size`` more bytes to ``entry``; returns the requests evicted for room:
        the oldest of the tenant holding the most bytes each time, never ``entry``."""
        entry.bytes_held += size
        self.bytes_held += size
        owner = _owner(entry)
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + size
        evicted: list[PendingRequest] = []
        while self.max_bytes is not None and self.bytes_held > self.max_bytes:
            by_bytes = sorted(self._owner_bytes, key=self._owner_bytes.__getitem__, reverse=True)
            victim = self._oldest_of(by_bytes, entry)
            if victim is None:
                break
            evicted.append(victim)
        self.byte_evictions += len(evicted)
        return evicted

    def _pop_oldest(self) -> PendingRequest:
        key, entry = next(iter(self._open.items()))
        self._remove(key)
        return entry

    def _remove(self, key: str) -> PendingRequest | None:
        entry = self._open.pop(key, None)
        if entry is not None:
            self.bytes_held -= entry.bytes_held
            owner = _owner(entry)
            self._owners.remove(owner, key)
            left = self._owner_bytes.get(owner, 0) - entry.bytes_held
            if self._owners.count(owner):
                self._owner_bytes[owner] = left
            else:
                self._owner_bytes.pop(owner, None)
        return entry

    def discard(self, key: str) -> None:
        """Forget an open request without remembering it as decided."""
        self._remove(key)

    def close(self, key: str, now_ms: float) -> PendingRequest | None:
        """Remove a request (it has been decided) and remember that it was."""
        entry = self._remove(key)
        self._done.add(key, now_ms)
        return entry

    def was_closed(self, key: str, now_ms: float) -> bool:
        return self._done.contains(key, now_ms)

    def expire(self, now_ms: float) -> list[PendingRequest]:
        """Remove and return every open request older than the TTL."""
        expired: list[PendingRequest] = []
        while self._open:
            entry = next(iter(self._open.values()))
            if now_ms - entry.first_seen_ms < self.ttl_ms:
                break
            expired.append(self._pop_oldest())
        self.expirations += len(expired)
        self._done.expire(now_ms)
        return expired

    def drop_partitions(self, partitions: set[tuple[str, int]]) -> int:
        """Forget open requests with any input on revoked partitions; returns how many."""
        doomed = [
            key
            for key, entry in self._open.items()
            if any(ref.tp in partitions for ref in entry.refs)
        ]
        for key in doomed:
            self._remove(key)
        return len(doomed)


def _owner(entry: PendingRequest) -> str:
    """Whose room a request takes: its trusted tenant ("" when the events name it)."""
    return entry.tenant or ""
