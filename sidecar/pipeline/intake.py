"""Admission of one input message: decode, envelope checks, tenancy, duplicates, holding.

``Intake.admit`` turns a consumed message into an ``Admission`` value and never
raises for bad input:

* ``Held``      the event is now part of an open request (it may complete it);
* ``Duplicate`` an identical copy of an event already held: finished, no output;
* ``Rejected``  the message goes to the dead-letter topic with the error's reason;
* ``Labelled``  a feedback event (not joined; the processor folds it in).

What an event needs checked on arrival happens here as well: the retrieval
event is certified (an unknown collection may be rejected), the final event's
attention summary is checked against the lookback model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config import LimitSettings, TenancySettings
from sidecar.contracts.codec import InputKind, decode_input
from sidecar.contracts.events import (
    FeedbackEvent,
    GenerationDelta,
    GenerationFinal,
    RetrievalEvent,
)
from sidecar.exceptions import InputError
from sidecar.pipeline.join import InputRef, JoinStore, PendingRequest
from sidecar.pipeline.ports import NOT_CONFIGURED_RETRIEVAL, SignalSuite

MAX_DELTAS_PER_REQUEST = 100_000

JoinedEvent = RetrievalEvent | GenerationDelta | GenerationFinal


@dataclass(frozen=True, slots=True)
class Held:
    entry: PendingRequest
    evicted: PendingRequest | None = None  # made room for this request (capacity)


@dataclass(frozen=True, slots=True)
class Duplicate:
    pass


@dataclass(frozen=True, slots=True)
class Rejected:
    error: InputError
    evicted: PendingRequest | None = None


@dataclass(frozen=True, slots=True)
class Labelled:
    feedback: FeedbackEvent


Admission = Held | Duplicate | Rejected | Labelled


def digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def check_key(key: bytes | None, request_id: str, where: str) -> None:
    """Every topic the sidecar reads is keyed by request_id (co-partitioning relies on it)."""
    if key is not None and key != request_id.encode("utf-8"):
        raise InputError(
            "key-mismatch",
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
    ) -> None:
        self.store = store
        self._signals = signals
        self._limits = limits
        self._tenancy = tenancy
        self._clock_ns = clock_ns

    def admit(
        self, kind: InputKind, raw: bytes | None, key: bytes | None, ref: InputRef, now_ms: float
    ) -> Admission:
        try:
            event = decode_input(
                kind,
                raw,
                max_bytes=self._limits.max_message_bytes,
                max_depth=self._limits.max_json_depth,
            )
            if isinstance(event, FeedbackEvent):
                check_key(key, event.request_id, "the feedback topic")
                return Labelled(event)
            check_key(key, event.request_id, "input topics")
            self._check_not_decided(event, now_ms)
            if isinstance(event, RetrievalEvent):
                self._check_tenant(event, ref)
        except InputError as exc:
            return Rejected(exc)
        entry, evicted = self.store.open(event.request_id, now_ms)
        try:
            identical = self._hold(entry, event, raw or b"")
        except InputError as exc:
            if not entry.refs:  # a fresh entry that holds nothing: do not keep it open
                self.store.discard(entry.request_id)
            return Rejected(exc, evicted)
        if identical:
            return Duplicate()
        entry.refs.append(ref)
        entry.raws.append((key, raw or b""))
        return Held(entry, evicted)

    def _check_not_decided(self, event: JoinedEvent, now_ms: float) -> None:
        if self.store.get(event.request_id) is None and self.store.was_closed(
            event.request_id, now_ms
        ):
            raise InputError(
                "after-final",
                f"request {event.request_id} was already decided; "
                f"this {event.event_type} event arrived too late",
            )

    def _check_tenant(self, event: RetrievalEvent, ref: InputRef) -> None:
        """The tenant selects calibration and policy: only a trusted source may name it."""
        tenancy = self._tenancy
        if tenancy.source == "event":
            return
        if tenancy.source == "fixed":
            trusted = tenancy.tenant
        else:
            values = [v for k, v in ref.headers if k == tenancy.header]
            if not values:
                raise InputError(
                    "untrusted-tenant", f"no {tenancy.header} header; the tenant must come from it"
                )
            trusted = values[-1].decode("utf-8", errors="replace")
        if event.tenant != trusted:
            raise InputError(
                "tenant-mismatch",
                f"event names tenant {event.tenant!r} but the trusted {tenancy.source} "
                f"says {trusted!r}",
            )

    # ------------------------------------------------------------------ holding

    def _hold(self, entry: PendingRequest, event: JoinedEvent, raw: bytes) -> bool:
        """Add the event to its request; True when it was an identical duplicate."""
        if isinstance(event, RetrievalEvent):
            return self._hold_retrieval(entry, event, raw)
        if isinstance(event, GenerationDelta):
            return self._hold_delta(entry, event)
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
        held = entry.deltas.get(event.seq)
        if held is not None:
            return _same(held == event.text, f"delta seq={event.seq}", event.request_id)
        if len(entry.deltas) >= MAX_DELTAS_PER_REQUEST:
            raise InputError(
                "too-many-deltas", f"more than {MAX_DELTAS_PER_REQUEST} deltas for one request"
            )
        entry.add_delta(event.seq, event.text)
        return False


def _same(identical: bool, what: str, request_id: str) -> bool:
    """An identical second copy is a harmless duplicate; a different one is a conflict."""
    if identical:
        return True
    raise InputError(
        "duplicate-conflict",
        f"a second {what} for request {request_id} with different content",
    )
