"""Admission of one input message: decode, envelope checks, tenancy, duplicates, holding.

``Intake.admit`` turns a consumed message into an ``Admission`` value and never
raises for bad input:

* ``Held``      the event is now part of an open request (it may complete it);
* ``Duplicate`` an identical copy of an event already held: finished, no output;
* ``Rejected``  the message goes to the dead-letter topic with the error's reason;
* ``Labelled``  a feedback event (not joined; the processor folds it in);
* ``Rerouted``  a record off the partition its request id hashes to, which another replica
  reads: sent on to that partition of its topic (``join.reroute``), where the replica
  holding its request's other half reads it (one this replica reads too: joined here).

What an event needs checked on arrival happens here as well: the limits
(hits, answer length, bytes per request), the retrieval event's certification
(an unknown collection or an absurd score may be rejected), the final event's
attention summary against the lookback model.

Tenancy: when the tenant comes from a trusted header (or is fixed), every
event — retrieval, delta, final, feedback — is checked against it and the
request is held under ``tenant/request_id``: one tenant's events can never
complete, decide or label another tenant's request.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from guardrail_client.inflate import UNREAD_HEADER
from guardrail_client.keys import partition_for
from guardrail_client.records import MAX_RECORD_HEADERS
from sidecar.config import LimitSettings, TenancySettings
from sidecar.contracts.codec import InputKind, decode_input, request_id_hint
from sidecar.contracts.common import NAME_MAX_CHARS, NAME_PATTERN, NAME_RULE
from sidecar.contracts.events import (
    FeedbackEvent,
    GenerationDelta,
    GenerationFinal,
    InputEvent,
    RetrievalEvent,
)
from sidecar.exceptions import InputError
from sidecar.pipeline.join import (
    MAX_REFUSAL_DETAIL,
    REROUTED_HEADER,
    InputRef,
    JoinStore,
    PendingRequest,
)
from sidecar.pipeline.owners import OwnedKeys
from sidecar.pipeline.ports import NOT_CONFIGURED_RETRIEVAL, SignalSuite

log = logging.getLogger("sidecar.pipeline")
_NAME = re.compile(NAME_PATTERN)

MAX_DELTAS_PER_REQUEST = 100_000
MAX_TENANT_CHARS = NAME_MAX_CHARS  # as the events' ``tenant`` (contracts.common.LabelName)

# What a held event keeps of its record's headers: the W3C trace context only (the
# verdict's trace parent). Other headers (a producer may send megabytes of them) are
# dead-lettered with a rejected record but never held. A trace header larger than the
# W3C baggage limit is not kept either.
TRACE_HEADERS = frozenset({"traceparent", "tracestate", "baggage"})
MAX_TRACE_HEADER_BYTES = 8192
# Heap a held event costs beyond its raw bytes (its decoded object, digest and index
# slots): measured 133 bytes for a one-character delta, the case where it matters most.
HELD_EVENT_OVERHEAD = 160
# Heap a retrieval hit costs beyond its text (its pydantic model, __dict__, fields-set, ids,
# score, and its normalised score in the certification): ~520 bytes a hit with the text's
# own getsizeof, ~470 without (tracemalloc; tests/pipeline/test_intake_limits.py checks
# it). Uncharged, 10,000 open retrievals of 256 one-character hits held 1.5 GB of RSS
# while the store counted 156 MB.
HELD_HIT_OVERHEAD = 480

JoinedEvent = RetrievalEvent | GenerationDelta | GenerationFinal
# requests whose first event was refused after it was read, remembered so that the rest of
# the request is decided at once naming the refusal (~0.7 KB each at most); past it, the
# tenant remembering the most forgets its oldest (one tenant's flood forgets its own)
MAX_REFUSALS_REMEMBERED = 4096


# not frozen: a frozen dataclass's ``__init__`` sets each field through
# ``object.__setattr__``, 0.34 us a ``Held`` against 0.13 us, and nearly every record is held
@dataclass(slots=True)
class Held:
    entry: PendingRequest
    evicted: tuple[PendingRequest, ...] = ()  # made room for this request (count or bytes)


@dataclass(frozen=True, slots=True)
class Duplicate:
    pass


@dataclass(frozen=True, slots=True)
class Rejected:
    """A refused record: its error becomes the dead letter's reason.

    The error's traceback (and its causes') is dropped here. It held the frames from the
    processor's ``on_batch`` down to the raise, and with them the record's bytes and the
    whole batch's items, in a cycle (this admission, held by ``_admit``'s frame, holds the
    error): only the cyclic collector freed them, and with the young generation walked
    every 50,000 objects (``GUARDRAIL_GC_YOUNG_THRESHOLD``), ~60 objects a refused record,
    300 schema-violating retrievals of ~900 KB took a real sidecar from 102 to 892 MB
    (tests/pipeline/test_refused_memory.py, tests/kafka/test_refused_memory_real.py).
    """

    error: InputError
    evicted: tuple[PendingRequest, ...] = ()
    # the request of a retrieval or final refused after it was read (``PendingRequest.refuse``)
    request: PendingRequest | None = None

    def __post_init__(self) -> None:
        drop_tracebacks(self.error)


def drop_tracebacks(exc: BaseException) -> None:
    """Clear the traceback of ``exc`` and of every exception it chains to, and drop a
    context it suppresses (``raise ... from None``): never shown, and a pydantic
    ``ValidationError`` there holds a validator's own error, with its traceback, where no
    chain reaches it."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        if e.__suppress_context__:
            e.__context__ = None
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)


@dataclass(frozen=True, slots=True)
class Labelled:
    feedback: FeedbackEvent
    tenant: str | None  # the trusted tenant (None: tenancy comes from the events)


@dataclass(frozen=True, slots=True)
class Rerouted:
    """A record read off its request's murmur2 partition: to be sent, as it came, to its
    topic keyed by ``request_id`` (the producer's murmur2 puts it on that partition)."""

    request_id: str


Admission = Held | Duplicate | Rejected | Labelled | Rerouted


def is_rerouted_copy(ref: InputRef) -> bool:
    """Whether the record carries ``REROUTED_HEADER``: a copy the sidecar rerouted."""
    return any(name == REROUTED_HEADER for name, _ in ref.headers)


_getsizeof = sys.getsizeof


def digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def held_bytes(
    event: JoinedEvent, raw: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()
) -> int:
    """What holding ``event`` costs the byte budgets: its raw bytes (or what its
    texts take in memory, when that is more), the decoded attention summary a final
    event keeps beside them, the header bytes it keeps and a fixed per-event overhead
    (a hostile producer's finals without retrievals, or its one-character deltas, must
    not hold more memory than the budget says).

    Python stores a string at 1, 2 or 4 bytes per character, by its widest one: a
    retrieval whose chunks each hold one emoji takes ~4x its UTF-8 bytes, which the
    raw size alone would not count.
    """
    # the memory of the event's texts (sys.getsizeof: header and 1-4 bytes a character),
    # and what each kind holds beside them, in one dispatch on its type; plain loops and
    # comparisons, no generator or ``max``: ~0.4 us less for a retrieval of 4 hits
    extra = HELD_EVENT_OVERHEAD
    if type(event) is GenerationDelta:
        text = _getsizeof(event.text)
    elif type(event) is RetrievalEvent:
        hits = event.hits
        text = _getsizeof(event.query)
        for hit in hits:
            text += _getsizeof(hit.text)
        extra += HELD_HIT_OVERHEAD * len(hits)
    elif type(event) is GenerationFinal:
        text = _getsizeof(event.answer)
        attention = event.attention
        if attention is not None:
            extra += attention.decoded_bytes
    else:
        text = 0
    raw_bytes = len(raw) if raw else 0
    size = (raw_bytes if raw_bytes > text else text) + extra
    for name, value in headers:
        size += len(name) + len(value)
    return size


def _delta_bytes(text: str, headers: tuple[tuple[str, bytes], ...]) -> int:
    """A delta's text (UTF-8) and the headers it keeps."""
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    for name, value in headers:
        size += len(name) + len(value)
    return size


def _check_read(ref: InputRef) -> None:
    """A record standing in for a compressed batch's records that could not be read, or a
    record whose headers were not (guardrail_client/records.py): its reason and the offsets
    it covers, to the DLQ."""
    for name, value in ref.headers:
        if name == UNREAD_HEADER:
            note = value.decode("utf-8", "replace")
            reason, _, detail = note.partition(": ")
            if reason not in (
                "batch-too-large",
                "corrupt-batch",
                "unsupported-codec",
                "too-many-headers",
            ):
                reason, detail = "unreadable-batch", note  # a producer's own header
            raise InputError(reason, detail[:2000])


def held_ref(ref: InputRef) -> InputRef:
    """``ref`` with only the headers a held event keeps (:data:`TRACE_HEADERS`): the last of
    each name, the one a propagator reads (audit: 120 copies of an 8 KiB ``baggage`` on
    each of five ~1 MB records were all held and counted, and their request was
    dead-lettered ``request-too-large``)."""
    headers = ref.headers
    if not headers:
        return ref
    last = {k: v for k, v in headers if k in TRACE_HEADERS}  # a later copy replaces
    kept = tuple((k, v) for k, v in last.items() if len(v) <= MAX_TRACE_HEADER_BYTES)
    if kept == headers:
        return ref
    return InputRef(
        ref.topic,
        ref.partition,
        ref.offset,
        kept,
        ref.timestamp_ms,
        incarnation=ref.incarnation,
        partitions=ref.partitions,
    )


KEY_MISMATCH = "key-mismatch"


def check_key(key: bytes | None, request_id: str, where: str) -> None:
    """Every topic the sidecar reads is keyed by request_id (co-partitioning relies on it)."""
    if key is not None and key != request_id.encode("utf-8"):
        raise InputError(
            KEY_MISMATCH,
            f"message key {key[:64]!r} differs from request_id {request_id!r}; "
            f"{where} must be keyed by request_id",
        )


class Intake:
    """Admits messages into the join store. Single-threaded, like the processor."""

    def __init__(
        self,
        store: JoinStore,
        signals: SignalSuite,
        *,
        limits: LimitSettings,
        tenancy: TenancySettings,
        clock_ns: Callable[[], int],
        reroute: bool = False,
    ) -> None:
        """``reroute``: a record off its request's murmur2 partition is ``Rerouted`` (the
        service sends it there) instead of joined where it was read."""
        self.store = store
        self._reroute = reroute
        self._signals = signals
        self._limits = limits
        self._tenancy = tenancy
        self._clock_ns = clock_ns
        self._tenant_from_events = tenancy.source == "event"
        self._max_message_bytes = limits.max_message_bytes
        self._max_json_depth = limits.max_json_depth
        self.partition_mismatches = 0  # requests whose inputs came on two partition numbers
        # requests decided incomplete, and labels, with an input off its murmur2 partition
        self.misrouted = 0
        self.rerouted = 0  # records sent on to their request's murmur2 partition
        # the (topic, partition)s this replica reads (the service sets it at each assignment);
        # a record off its request's partition is joined here when that partition is one of
        # them. None: not known, every such record is rerouted
        self.local_partitions: frozenset[tuple[str, int]] | None = None
        # records off their request's partition (rerouted copies, or read beside it) that came
        # after their request's verdict, or deltas after its final: finished, not dead-lettered
        self.rerouted_late = 0
        # the highest offset admitted per input partition and life of its topic, kept across
        # revocations: a record at or below it is read a second time (a rebalance or a
        # restart of the consumer resumes from the committed offset, which open requests
        # hold back); a topic deleted and created again starts its offsets over
        self._read_up_to: dict[tuple[str, int, int], int] = {}
        self.rereads = 0  # records of decided requests read again: finished, not dead-lettered
        self.handed_over = 0  # finals a last owner decided, remembered as decided here
        # store key -> (half, reason, detail) of requests whose first event was refused
        # after it was read (``_refused``), and their keys by trusted tenant ("" when events
        # name it): past the bound, the tenant remembering the most forgets its oldest
        self._refused_first: dict[str, tuple[str, str, str]] = {}
        self._refused_owners = OwnedKeys()

    def admit(
        self, kind: InputKind, raw: bytes | None, key: bytes | None, ref: InputRef, now_ms: float
    ) -> Admission:
        self.store.note_record()
        position = (ref.topic, ref.partition, ref.incarnation)
        read_up_to = self._read_up_to
        reread = ref.offset <= read_up_to.get(position, -1)
        if not reread:
            read_up_to[position] = ref.offset
        event: RetrievalEvent | GenerationDelta | GenerationFinal | FeedbackEvent | None = None
        # the common record (no headers, tenancy from the events, its request open already)
        # calls nothing it need not: each call left out here is ~0.1 us a record
        try:
            if ref.headers:
                _check_read(ref)
            event = decode_input(
                kind, raw, max_bytes=self._max_message_bytes, max_depth=self._max_json_depth
            )
            tenant = None if self._tenant_from_events else self._trusted_tenant(ref)
            if isinstance(event, FeedbackEvent):
                check_key(key, event.request_id, "the feedback topic")
                return self._labelled(event, tenant, ref, reread)
            request_id = event.request_id
            if key is not None and key != request_id.encode("utf-8"):
                check_key(key, request_id, "input topics")  # raises, naming both
            if tenant is None:
                store_key = request_id
            else:
                self._check_tenant(event, tenant)
                store_key = self.store_key(request_id, tenant)
            # one look-up of the open requests: a request open here was not decided (its
            # events after the first skip the decided memory and a second look-up in ``_open``)
            entry = self.store.get(store_key)
            decided = entry is None and self.store.was_closed(store_key, now_ms)
            if decided and reread:
                # read before and its request decided since: the verdict is out (a
                # producer's re-send is a new record, at a new offset, and stays after-final)
                self.rereads += 1
                return Duplicate()
            # the first input of a request here, or one on a partition number its request
            # holds none on yet: one murmur2 (~3 µs) tells whether it belongs here. Before the
            # decided memory: a request's records off its partition are its partition's to
            # judge, late or not (a replica holding both decided it; rerouted, a late delta
            # is finished there, not dead-lettered here)
            if (
                self._reroute
                and ref.partitions > 1
                and (entry is None or ref.partition not in entry.partitions)
                and self._reroute_to(request_id, ref, reread) is not None
            ):
                return Rerouted(request_id)
            if decided:
                if self._off_partition(request_id, ref):
                    # off its request's partition, after its verdict: a rerouted copy sent
                    # again by a replica that restarted before it committed the original, or
                    # one overtaken, or a record read here beside that partition, whose
                    # order against it no producer keeps
                    self.rerouted_late += 1
                    return Duplicate()
                self._after_final(event, store_key, now_ms)
        except InputError as exc:
            return self._rejected(exc, kind, event, key, ref, now_ms=now_ms)
        earlier = None
        if entry is None or not entry.refs:  # opened here (or held nothing yet): ``_open``
            entry, earlier = self._open(store_key, request_id, tenant, now_ms)
        return self._take(event, raw, ref, entry, earlier)

    def _take(
        self,
        event: JoinedEvent,
        raw: bytes | None,
        ref: InputRef,
        entry: PendingRequest,
        earlier: tuple[str, str, str] | None,
    ) -> Held | Duplicate | Rejected:
        """Hold an admitted event in its request's open ``entry`` (``earlier``: ``_open``'s)
        when it is within the limits, and count what it holds."""
        if (
            type(event) is GenerationDelta
            and entry.final is not None
            and self._reroute
            and (
                len(entry.partitions) > 1
                or ref.partition not in entry.partitions
                or self._off_partition(event.request_id, ref)
            )
        ):
            # a delta overtaken by its request's final where the request's inputs come on
            # several partitions (a round-robin producer: no order between them), or off its
            # request's partition: the final holds the whole answer
            self.rerouted_late += 1
            return Duplicate()
        if ref.headers:
            ref = held_ref(ref)
        size = held_bytes(event, raw, ref.headers)
        # a delta counts its text and the headers it keeps against the request's limit;
        # its framing and the fixed overhead count in the store's budget only (at most
        # MAX_DELTAS_PER_REQUEST of them): charged ~250 bytes a delta, an answer streamed a
        # token at a time crossed 4 MiB near 16,500 deltas of the 100,000 allowed (audit)
        counted = _delta_bytes(event.text, ref.headers) if type(event) is GenerationDelta else size
        try:
            if type(event) is not GenerationDelta:  # a delta's limits: ``_hold_delta``
                self._check_limits(event)
            self._check_request_bytes(entry, counted, size)
            identical = self._hold(entry, event, raw or b"")
        except InputError as exc:
            exc.request_id = exc.request_id or event.request_id
            return self._refused(exc, event, entry, earlier)
        if identical:
            return Duplicate()
        if ref.partition not in entry.partitions:  # else checked already (its first input)
            self._check_partitions(entry, ref)
        entry.refs.append(ref)
        if type(event) is GenerationFinal:
            entry.final_headers = ref.headers
            entry.final_timestamp_ms = ref.timestamp_ms
        entry.request_bytes += counted
        evictions = self.store.make_room(entry)
        made_room = self.store.hold_bytes(entry, size)
        return Held(entry, (*evictions, *made_room) if evictions or made_room else ())

    def _open(
        self, store_key: str, request_id: str, tenant: str | None, now_ms: float
    ) -> tuple[PendingRequest, tuple[str, str, str] | None]:
        """The request's entry, opened if need be; a fresh one takes over the refusal
        remembered for its request (returned too: ``_refused`` remembers it again when the
        fresh entry is not kept)."""
        entry = self.store.open(store_key, now_ms, request_id=request_id, tenant=tenant)
        earlier = None
        if self._refused_first and not entry.refs:
            earlier = self._refused_first.pop(store_key, None)
            if earlier is not None:
                self._refused_owners.remove(tenant or "", store_key)
                entry.refuse(*earlier)
        return entry, earlier

    def _rejected(
        self,
        exc: InputError,
        kind: InputKind,
        event: InputEvent | FeedbackEvent | None,
        key: bytes | None,
        ref: InputRef,
        *,
        now_ms: float,
    ) -> Rejected:
        """A message refused before its request's entry was opened (``event``: what was read
        of it, if anything)."""
        if event is None:
            if kind is InputKind.RETRIEVAL:
                return self._unreadable(exc, key, ref, now_ms)
            return Rejected(exc)
        if exc.request_id is None:
            exc.request_id = event.request_id  # the dead letter names the event's request
        if exc.reason == KEY_MISMATCH and isinstance(event, RetrievalEvent | GenerationFinal):
            return self._mis_keyed(exc, event, self._tenant(ref), now_ms)
        return Rejected(exc)

    def _mis_keyed(
        self,
        exc: InputError,
        event: RetrievalEvent | GenerationFinal,
        tenant: str | None,
        now_ms: float,
    ) -> Rejected:
        """A retrieval or final keyed by another id than its request_id (a producer keying
        by a session id): dead-lettered, and refused as a half of the request its body
        names, as one over a limit is, so that the request is decided ``incomplete`` naming
        the key once the rest has come (audit: it waited out the TTL for a verdict saying
        only what was missing, and a request with both halves mis-keyed got no verdict)."""
        store_key = self.store_key(event.request_id, tenant)
        if self._decided(store_key, now_ms):
            return Rejected(exc)
        entry, earlier = self._open(store_key, event.request_id, tenant, now_ms)
        return self._refused(exc, event, entry, earlier)

    def _refused(
        self,
        exc: InputError,
        event: JoinedEvent,
        entry: PendingRequest,
        earlier: tuple[str, str, str] | None,
    ) -> Rejected:
        """An event refused once its request's entry was open. It costs no other request
        its place (room is made only for held events), and a fresh entry is not kept.

        A retrieval or final refused (over a limit, a lookback summary that does not fit;
        not a conflicting duplicate, whose first copy is held): once the rest of its
        request is here, the request cannot complete and is decided ``incomplete`` naming
        this dead letter (before, it waited out the join TTL, and its verdict said the
        final was missing though it had come: 30 s per over-long answer, in the audit).
        Its refusal is remembered aside when it was the request's first event; so is
        ``earlier``, the refusal remembered for the request before, when the fresh entry
        it was taken into is not kept."""
        if type(event) is GenerationDelta or exc.reason == "duplicate-conflict":
            if not entry.refs:
                self.store.discard(entry.store_key)
                if earlier is not None:  # a refused delta does not forget the refused half
                    self._remember(entry.store_key, entry.tenant, earlier)
            return Rejected(exc)
        part = event.event_type
        entry.refuse(part, exc.reason, exc.detail)
        if entry.refs or entry.cannot_complete:
            return Rejected(exc, request=entry)
        self.store.discard(entry.store_key)
        self._remember(entry.store_key, entry.tenant, (part, exc.reason, exc.detail))
        return Rejected(exc)

    def _unreadable(
        self, exc: InputError, key: bytes | None, ref: InputRef, now_ms: float
    ) -> Rejected:
        """A record of the retrieval topic that could not be read (malformed JSON, a schema
        violation): its Kafka key names its request (the key of every readable input is its
        request id), so the request is decided ``incomplete`` naming this dead letter once
        the rest has come, as for a retrieval over a limit (before: at the join TTL,
        "missing: retrieval"). No key a request id could be, or no trusted tenant: nothing."""
        request_id = request_id_hint(None, key)
        if request_id is None:
            return Rejected(exc)
        try:
            tenant = self._tenant(ref)
        except InputError:
            return Rejected(exc)
        store_key = self.store_key(request_id, tenant)
        entry = self.store.get(store_key)
        if entry is not None:
            entry.refuse("retrieval", exc.reason, exc.detail)
            return Rejected(exc, request=entry)
        if not self._decided(store_key, now_ms):
            self._remember(store_key, tenant, ("retrieval", exc.reason, exc.detail))
        return Rejected(exc)

    def _remember(self, store_key: str, tenant: str | None, refusal: tuple[str, str, str]) -> None:
        """Remember a request's refused first half (half, reason, detail); past the bound
        the tenant remembering the most forgets its oldest: one tenant's 4,096 refused
        retrievals no longer make every other tenant's refused requests wait out the TTL."""
        remembered, owners = self._refused_first, self._refused_owners
        half, reason, detail = refusal
        remembered[store_key] = (half, reason, detail[:MAX_REFUSAL_DETAIL])
        owners.add(tenant or "", store_key)
        while len(remembered) > MAX_REFUSALS_REMEMBERED:
            owner = next(owners.largest())
            oldest = next(owners.keys_of(owner))
            owners.remove(owner, oldest)
            del remembered[oldest]

    def _check_partitions(self, entry: PendingRequest, ref: InputRef) -> None:
        """Halves that meet on two partition numbers: a ``partition_mismatch`` (mixed
        partitioners, or partition counts that changed). Checked once per partition number
        a request holds inputs on, not per input (an answer of 100,000 deltas made it
        quadratic; audit: 40,000 one-character deltas took 14 s, 100,000 minutes, of the
        processor thread)."""
        partition, seen = ref.partition, entry.partitions
        if partition in seen:
            return
        seen[partition] = ref.topic
        if len(seen) != 2:  # counted once, when a second partition number appears
            return
        self.partition_mismatches += 1
        if self.partition_mismatches == 1:
            other = next(p for p in seen if p != partition)
            log.warning(
                "request %s arrived on %s[%d] and %s[%d]: the input topics' partition "
                "counts changed while it was in flight (the readiness probe logs that), or "
                "its producers do not partition the same way: every producer must use "
                "Kafka's murmur2 partitioner on key = request_id (librdkafka: "
                "partitioner=murmur2_random). Counted in guardrail.join.partition_mismatch; "
                "warned once.",
                entry.request_id, seen[other], other, ref.topic, partition,
            )  # fmt: skip

    def note_misrouted(self, entry: PendingRequest) -> None:
        """A request decided ``incomplete``: its first input on another partition than the
        one murmur2 puts its request id on, in ``entry.misrouted`` (counted in
        ``misrouted``). Its producer does not partition as Kafka's default does, and the
        request's other half may be on a partition another replica reads: neither half
        meets the other and each replica decides it ``incomplete`` at the TTL; before,
        nothing said why (audit: 3 replicas, generation events from librdkafka's default
        partitioner: 21 of 30 requests got two ``incomplete`` verdicts each, and every
        counter stayed 0). Looked at here, not as each request's first input comes: a
        murmur2 per request cost the fast path ~25 µs, a third of what the no-op
        passthrough spends on a whole answer."""
        checked: set[int] = set()
        for ref in entry.refs:
            if ref.partition in checked:
                continue
            home = self._off_home(entry.request_id, ref)
            if home is not None:
                entry.misrouted = (ref.topic, ref.partition, home)
                return
            checked.add(ref.partition)
            if len(checked) == len(entry.partitions):
                return

    def _off_home(self, request_id: str, ref: InputRef) -> int | None:
        """The partition murmur2 puts ``request_id`` on, when ``ref`` is on another (counted
        in ``misrouted``, the first one logged); ``None`` when it is there, or when its
        topic's partition count is not known."""
        if ref.partitions <= 0:
            return None
        home = partition_for(request_id, ref.partitions)
        if home == ref.partition:
            return None
        self.misrouted += 1
        if self.misrouted == 1:
            log.warning(
                "an input of request %s arrived on %s[%d], but murmur2 of its request id puts "
                "it on partition %d of %d: its producer does not use Kafka's default "
                "partitioner on key = request_id (librdkafka's default is consistent_random: "
                "set partitioner=murmur2_random), or the topic's partition count changed "
                "since it was written. A request whose halves (or label) are read by two "
                "replicas is decided incomplete by each (its label unmatched). Counted in "
                "guardrail.join.misrouted; warned once.",
                request_id, ref.topic, ref.partition, home, ref.partitions,
            )  # fmt: skip
        return home

    def _off_partition(self, request_id: str, ref: InputRef) -> bool:
        """With rerouting on: a rerouted copy, or a record read off its request's murmur2
        partition (on one this replica reads too, or the count is not known)."""
        if not self._reroute:
            return False
        if ref.headers and is_rerouted_copy(ref):
            return True
        return ref.partitions > 1 and partition_for(request_id, ref.partitions) != ref.partition

    @staticmethod
    def label_partition(request_id: str, ref: InputRef) -> int:
        """The partition whose coverage windows a label read at ``ref`` counts in: its
        request's (murmur2 of its id, as the client keys labels), so a label and its
        rerouted copy, read back together, are one label; where it was read when the
        partition count is not known."""
        return partition_for(request_id, ref.partitions) if ref.partitions > 1 else ref.partition

    def read_back_label(
        self, raw: bytes | None, key: bytes | None, ref: InputRef
    ) -> tuple[str, FeedbackEvent, str] | None:
        """A feedback record read back from its topic (a partition's labels, on assignment)
        as :meth:`admit` would take it: its request's store key, the label and its trusted
        tenant ("" when events name it); ``None`` for one admit would dead-letter (it was,
        when first read). Counts nothing."""
        try:
            if ref.headers:
                _check_read(ref)
            event = decode_input(
                InputKind.FEEDBACK,
                raw,
                max_bytes=self._max_message_bytes,
                max_depth=self._max_json_depth,
            )
            if not isinstance(event, FeedbackEvent):
                return None
            check_key(key, event.request_id, "the feedback topic")
            tenant = None if self._tenant_from_events else self._trusted_tenant(ref)
        except InputError:
            return None
        return self.store_key(event.request_id, tenant), event, tenant or ""

    def _labelled(
        self, event: FeedbackEvent, tenant: str | None, ref: InputRef, reread: bool
    ) -> Labelled | Rerouted:
        """A label, or where to reroute it: its request's replica may be another."""
        if self._reroute and ref.partitions > 1:
            home = self._reroute_to(event.request_id, ref, reread)
            if home is not None:
                return Rerouted(event.request_id)
        else:
            self._off_home(event.request_id, ref)
        return Labelled(event, tenant)

    def _reroute_to(self, request_id: str, ref: InputRef, reread: bool) -> int | None:
        """The partition murmur2 puts ``request_id`` on, when ``ref`` is on another that
        another replica reads and is not a rerouted copy itself (counted in ``rerouted``,
        unless read before: sent again, the copy is a duplicate there); ``None``: join it
        here."""
        home = _home_elsewhere(request_id, ref)
        if home is None:
            return None
        local = self.local_partitions
        if local is not None and (ref.topic, home) in local:
            # its partition is read here too: joined here (a partition mismatch), not sent
            # round. Rerouted, a catch-up's copies land behind the backlog of their
            # partition and every request waits for its copy: a drain of 20,000 requests
            # with every generation record off its partition decided 10,000 incomplete
            # (capacity), 0 joined here
            return None
        if not reread:
            self.rerouted += 1
            if self.rerouted == 1:
                log.warning(
                    "an input of request %s arrived on %s[%d], but murmur2 of its request id "
                    "puts it on partition %d of %d: its producer does not use Kafka's default "
                    "partitioner on key = request_id (librdkafka's default is "
                    "consistent_random: set partitioner=murmur2_random). Such records are "
                    "sent on to their partition (GUARDRAIL_JOIN__REROUTE), a produce and a "
                    "fetch later than they could be read, and a request whose halves are read "
                    "by two replicas waits for both (when one dies, until its session times "
                    "out: keep GUARDRAIL_JOIN__TTL_MS above GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS"
                    "); counted in guardrail.join.rerouted; warned once.",
                    request_id, ref.topic, ref.partition, home, ref.partitions,
                )  # fmt: skip
        return home

    def store_key(self, request_id: str, tenant: str | None) -> str:
        """Request ids are scoped by the trusted tenant (when there is one)."""
        return request_id if tenant is None else f"{tenant}/{request_id}"

    def decided_key(self, request_id: str, tenant: str | None) -> str:
        """The store key a request had, from its verdict's ``tenant`` (its retrieval
        event's): a trusted tenant (header, fixed) is the event's, which must agree."""
        return self.store_key(request_id, None if self._tenancy.source == "event" else tenant)

    def _trusted_tenant(self, ref: InputRef) -> str | None:
        """The tenant a trusted source names for this message; None when events name it."""
        tenancy = self._tenancy
        if tenancy.source == "event":
            return None
        if tenancy.source == "fixed":
            return tenancy.tenant
        values = [v for k, v in ref.headers if k == tenancy.header]
        if not values:
            raise InputError(
                "untrusted-tenant", f"no {tenancy.header} header; the tenant must come from it"
            )
        if len(set(values)) > 1:  # which one the trusted source set cannot be told
            raise InputError(
                "untrusted-tenant", f"{len(values)} {tenancy.header} headers that disagree"
            )
        try:
            tenant = values[-1].decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(
                "untrusted-tenant", f"the {tenancy.header} header is not valid UTF-8"
            ) from None
        if not tenant or len(tenant) > MAX_TENANT_CHARS:  # the events' own tenant: Name
            raise InputError(
                "untrusted-tenant",
                f"the {tenancy.header} header holds {len(tenant)} characters; a tenant has "
                f"1 to {MAX_TENANT_CHARS}",
            )
        if _NAME.fullmatch(tenant) is None:  # as the events' own tenant (common.LabelName)
            raise InputError(
                "untrusted-tenant",
                f"the {tenancy.header} header holds characters a tenant may not have ({NAME_RULE})",
            )
        return tenant

    def _check_tenant(self, event: JoinedEvent, tenant: str | None) -> None:
        if tenant is not None and type(event) is RetrievalEvent and event.tenant != tenant:
            raise InputError(
                "tenant-mismatch",
                f"event names tenant {event.tenant!r} but the trusted "
                f"{self._tenancy.source} says {tenant!r}",
            )

    def _check_request_bytes(self, entry: PendingRequest, counted: int, size: int) -> None:
        """The request's events (not its evidence index, bounded on its own) within the limit
        (``counted``: what the event adds to it), and the request's memory (``size`` more)
        within what all open requests may hold together.

        The index is built when the retrieval arrives, so counting it here would
        refuse a final that comes after a large retrieval and accept the same final
        before it: the outcome would depend on the order of two topics.
        """
        events = entry.request_bytes
        if events + counted > self._limits.max_request_bytes:
            raise InputError(
                "request-too-large",
                f"request {entry.request_id} would hold {events + counted} bytes, "
                f"the limit is {self._limits.max_request_bytes} (max_request_bytes)",
            )
        budget = self.store.max_bytes
        if budget is not None and entry.bytes_held + size > budget:
            raise InputError(
                "request-too-large",
                f"request {entry.request_id} would hold {entry.bytes_held + size} bytes, "
                f"more than all open requests may hold together ({budget}, join max_bytes)",
            )

    def _check_limits(self, event: JoinedEvent) -> None:
        limits = self._limits
        if type(event) is RetrievalEvent and len(event.hits) > limits.max_hits:
            raise InputError(
                "too-many-hits",
                f"{len(event.hits)} hits, the limit is {limits.max_hits} (max_hits)",
            )
        if type(event) is GenerationFinal and len(event.answer) > limits.max_answer_chars:
            raise InputError(
                "answer-too-long",
                f"the answer has {len(event.answer)} characters, the limit is "
                f"{limits.max_answer_chars} (max_answer_chars)",
            )

    def _decode(self, kind: InputKind, raw: bytes | None) -> InputEvent | FeedbackEvent:
        return decode_input(
            kind, raw, max_bytes=self._max_message_bytes, max_depth=self._max_json_depth
        )

    def _tenant(self, ref: InputRef) -> str | None:
        """The trusted tenant of a record (``None``: tenancy comes from the events)."""
        return None if self._tenant_from_events else self._trusted_tenant(ref)

    def finished_before(
        self, kind: InputKind, raw: bytes | None, ref: InputRef, now_ms: float
    ) -> Admission:
        """A record the partition's last owner finished (its handover): a final event's
        request is remembered as decided, as if decided here, so a late or re-sent event of
        it is ``after-final`` (audit: B, skipping what A decided, answered A's re-sent final
        ``incomplete``, under another idempotency key). Nothing else of it is kept.

        A final its last owner rerouted (off its request's murmur2 partition) was not
        decided there: its copy is on its request's partition, and the request is
        decided where that is read. Remembered as decided here, the request's
        retrieval, when this replica also reads that partition and had not read it
        yet, was dead-lettered ``after-final`` and the request never decided."""
        try:
            event = self._decode(kind, raw)
            if type(event) is GenerationFinal and not self._was_rerouted(event.request_id, ref):
                store_key = self.store_key(event.request_id, self._tenant(ref))
                if self.store.get(store_key) is None:
                    self.store.close(store_key, now_ms)
                    self.handed_over += 1
        except InputError:
            pass  # the last owner dead-lettered it already
        return Duplicate()

    def _was_rerouted(self, request_id: str, ref: InputRef) -> bool:
        """Whether ``admit`` reroutes (rerouted, when read before) the record at ``ref``."""
        return self._reroute and ref.partitions > 1 and _home_elsewhere(request_id, ref) is not None

    def _decided(self, store_key: str, now_ms: float) -> bool:
        return self.store.get(store_key) is None and self.store.was_closed(store_key, now_ms)

    def _after_final(self, event: JoinedEvent, store_key: str, now_ms: float) -> NoReturn:
        """An event of a request decided here (not open, in the decided memory): refused."""
        # remembered from now on: a stream that trickles on past the decided memory is
        # dead-lettered, never opened again for a second verdict
        self.store.close(store_key, now_ms)
        raise InputError(
            "after-final",
            f"request {event.request_id} was already decided; "
            f"this {event.event_type} event arrived too late",
        )

    # ------------------------------------------------------------------ holding

    def _hold(self, entry: PendingRequest, event: JoinedEvent, raw: bytes) -> bool:
        """Add the event to its request; True when it was an identical duplicate."""
        # deltas first, the most of a request's events: a model's ``isinstance`` that fails
        # goes through pydantic's ABC metaclass (~0.1 us), one that holds does not
        if isinstance(event, GenerationDelta):
            return self._hold_delta(entry, event)
        if isinstance(event, RetrievalEvent):
            return self._hold_retrieval(entry, event, raw)
        return self._hold_final(entry, event, raw)

    def _hold_retrieval(self, entry: PendingRequest, event: RetrievalEvent, raw: bytes) -> bool:
        held = digest(raw)
        if entry.retrieval is not None:
            return _same(entry.retrieval_digest == held, "retrieval", event.request_id)
        t0 = self._clock_ns()
        certifier = self._signals.certifier
        certification = (
            certifier.certify(event) if certifier is not None else NOT_CONFIGURED_RETRIEVAL
        )
        entry.retrieval, entry.retrieval_digest = event, held
        entry.certification = certification
        entry.stages.append(("certify", t0, self._clock_ns()))
        return False

    def _hold_final(self, entry: PendingRequest, event: GenerationFinal, raw: bytes) -> bool:
        held = digest(raw)
        if entry.final is not None:
            return _same(entry.final_digest == held, "generation.final", event.request_id)
        if self._signals.lookback is not None:
            self._signals.lookback.check(event)
        entry.final, entry.final_digest = event, held
        return False

    def _hold_delta(self, entry: PendingRequest, event: GenerationDelta) -> bool:
        if entry.final is not None:
            raise InputError("after-final", f"delta seq={event.seq} arrived after the final event")
        same = entry.same_delta(event.seq, event.text)
        if same is not None:
            return _same(same, f"delta seq={event.seq}", event.request_id)
        if len(entry.deltas) >= MAX_DELTAS_PER_REQUEST:
            raise InputError(
                "too-many-deltas", f"more than {MAX_DELTAS_PER_REQUEST} deltas for one request"
            )
        # deltas held ahead of a gap count too: seq 0 sent last took the answer past the
        # limit unchecked (1.84M characters streamed and verified against 200,000)
        streamed = entry.streamed_chars + entry.held_chars + len(event.text)
        if streamed > self._limits.max_answer_chars:
            raise InputError(
                "answer-too-long",
                f"the streamed answer would have {streamed} characters, the limit is "
                f"{self._limits.max_answer_chars} (max_answer_chars)",
            )
        entry.add_delta(event.seq, event.text)
        return False


def _home_elsewhere(request_id: str, ref: InputRef) -> int | None:
    """The partition murmur2 puts ``request_id`` on (of ``ref.partitions``, at least 1), when
    the record at ``ref`` is on another and may be rerouted there; ``None``: joined here."""
    home = partition_for(request_id, ref.partitions)
    if home == ref.partition:
        return None
    if ref.headers and (is_rerouted_copy(ref) or len(ref.headers) >= MAX_RECORD_HEADERS):
        # rerouted once and still off its partition: the partition count changed in between,
        # or its producer wrote the header; or the header would be one too many for the
        # copy to be read (``too-many-headers``). Joined here
        return None
    return home


def _same(identical: bool, what: str, request_id: str) -> bool:
    """An identical second copy is a harmless duplicate; a different one is a conflict."""
    if identical:
        return True
    raise InputError(
        "duplicate-conflict",
        f"a second {what} for request {request_id} with different content",
    )
