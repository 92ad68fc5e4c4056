"""Building the LLM service's events: contract models, per-request sequence numbers, headers.

No Kafka here: ``EventBuilder`` turns a call such as ``delta(request_id, text)``
into a validated contract event and the record that carries it (topic, key,
value, headers). It is thread-safe, so the sync publisher builds on the
caller's thread and only hands finished records to its loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from guardrail_client.exceptions import InvalidArgumentError, InvalidEventError
from guardrail_client.keys import request_key
from sidecar.contracts.codec import encode
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationDelta,
    GenerationFinal,
    RetrievalEvent,
    RetrievalHit,
)

try:  # OpenTelemetry is optional: without it no trace context travels
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - opentelemetry-api is installed with the client extra
    _PROPAGATOR = None

log = logging.getLogger("guardrail_client")

Header = tuple[str, bytes]
ClientEvent = RetrievalEvent | GenerationDelta | GenerationFinal
HitLike = RetrievalHit | Mapping[str, Any]
E = TypeVar("E", RetrievalEvent, GenerationDelta, GenerationFinal)


@dataclass(frozen=True, slots=True)
class OutgoingRecord(Generic[E]):
    """One event ready to send: where, under which key, with which headers."""

    topic: str
    key: bytes
    value: bytes
    headers: tuple[Header, ...]
    event: E


@dataclass(slots=True)
class _OpenRequest:
    next_seq: int = 0
    tenant: str | None = None
    streamed_chars: int = 0
    retrieval_sent: bool = False


REUSE_MEMORY_S = 600.0
"""How long a finished request's id is remembered, to refuse its reuse: the sidecar's
``GUARDRAIL_JOIN__DECIDED_MEMORY_MS`` default (it dead-letters a decided id's new events)."""


@dataclass(frozen=True, slots=True)
class SidecarLimits:
    """The sidecar's input limits, at its defaults: an event beyond them would be
    dead-lettered there, never decided (and a caller failing open would show the answer
    unchecked), so the client refuses it with ``InvalidEventError``. Pass the values of
    your sidecar's ``GUARDRAIL_LIMITS__*`` when you changed them."""

    max_hits: int = 256  # GUARDRAIL_LIMITS__MAX_HITS
    max_answer_chars: int = 200_000  # GUARDRAIL_LIMITS__MAX_ANSWER_CHARS (final, or streamed)
    max_message_bytes: int = 1_048_576  # GUARDRAIL_LIMITS__MAX_MESSAGE_BYTES (encoded value)
    max_deltas: int = 100_000  # deltas per request


def trace_headers() -> list[Header]:
    """The current OpenTelemetry context as W3C ``traceparent`` (and ``tracestate``) headers.

    Empty when there is no valid current span (or OpenTelemetry is not installed).
    """
    if _PROPAGATOR is None:
        return []
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return [(name, value.encode("ascii")) for name, value in sorted(carrier.items())]


def _summarise(exc: ValidationError, limit: int = 3) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _require_str(event_type: str, name: str, value: object) -> None:
    """Checked before ``value`` is used as a key or measured (where a wrong type would
    raise a bare ``TypeError``); the contract models check everything else."""
    if not isinstance(value, str):
        raise InvalidEventError(
            event_type, f"{name}: expected a string, got {type(value).__name__}"
        )


def _hit_fields(hits: object) -> list[dict[str, Any]]:
    """The hits as plain mappings for the contract model; a container or a hit of the
    wrong kind raises ``InvalidEventError`` naming its position."""
    if isinstance(hits, str | bytes | Mapping) or not isinstance(hits, Sequence):
        raise InvalidEventError(
            "retrieval",
            f"hits: expected a sequence (list or tuple) of RetrievalHit or mappings, "
            f"got {type(hits).__name__}",
        )
    fields = []
    for i, hit in enumerate(hits):
        if isinstance(hit, RetrievalHit):
            fields.append(hit.model_dump())
        elif isinstance(hit, Mapping):
            fields.append(dict(hit))
        else:
            raise InvalidEventError(
                "retrieval",
                f"hits.{i}: expected a RetrievalHit or a mapping, got {type(hit).__name__}",
            )
    return fields


def _reused(event_type: str, request_id: str, what: str) -> InvalidEventError:
    return InvalidEventError(
        event_type,
        f"request id {request_id!r} was used already ({what}): the sidecar dead-letters a "
        "decided request's new events as after-final (for GUARDRAIL_JOIN__DECIDED_MEMORY_MS, "
        "10 minutes by default) and never decides them, while its old verdict stays on the "
        "verdict topic under that id; give every answer a new request id",
    )


def _validated(model: type[E], event_type: str, fields: dict[str, Any]) -> E:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise InvalidEventError(event_type, _summarise(exc)) from None


class EventBuilder:
    """Contract events for one LLM service, with each open request's delta count.

    ``delta`` numbers a request's pieces from 0 without gaps (as the sidecar
    requires) and ``final`` reports how many there were, then closes the
    request: for ``REUSE_MEMORY_S`` its id is refused (``InvalidEventError``)
    for a delta, a final or a second retrieval, since the sidecar would
    dead-letter them and the id's old verdict would stand for the new answer;
    a request's retrieval may still come after its final, once. The tenant
    named by ``retrieval`` travels as the ``tenant_header`` on all the
    request's events (the sidecar's ``tenancy.source=header`` reads
    it); at most ``max_open_requests`` requests are remembered, the oldest
    forgotten first (a request that never got its final).
    """

    def __init__(
        self,
        *,
        retrieval_topic: str,
        generation_topic: str,
        generator_model: str,
        tenant_header: str | None = "x-tenant",
        max_open_requests: int = 100_000,
        headers: Callable[[], list[Header]] = trace_headers,
        limits: SidecarLimits | None = None,
    ) -> None:
        if max_open_requests < 1:
            raise InvalidArgumentError(f"max_open_requests must be >= 1, got {max_open_requests}")
        self.limits = limits or SidecarLimits()
        self.retrieval_topic = retrieval_topic
        self.generation_topic = generation_topic
        self.generator_model = generator_model
        self.tenant_header = tenant_header
        self.max_open_requests = max_open_requests
        self._headers = headers
        self._open: OrderedDict[str, _OpenRequest] = OrderedDict()
        # finished requests (their final sent): id -> (when, its retrieval was sent too)
        self._finished: OrderedDict[str, tuple[float, bool]] = OrderedDict()
        self._clock = time.monotonic
        self._lock = threading.Lock()

    @property
    def open_requests(self) -> int:
        return len(self._open)

    def retrieval(
        self,
        request_id: str,
        query: str,
        hits: Sequence[HitLike],
        *,
        tenant: str,
        collection: str,
        retriever: str = "default",
        k: int | None = None,
        created_at: datetime | None = None,
    ) -> OutgoingRecord[RetrievalEvent]:
        """What was retrieved (best first); ``k`` defaults to ``len(hits)``.

        Any bad argument (a hit that is not a ``RetrievalHit`` or a mapping, a field of the
        wrong type) raises ``InvalidEventError``, never a bare ``TypeError``.
        """
        hit_fields = _hit_fields(hits)
        if len(hit_fields) > self.limits.max_hits:
            raise InvalidEventError(
                "retrieval",
                f"{len(hit_fields)} hits; the sidecar dead-letters more than "
                f"{self.limits.max_hits} (SidecarLimits.max_hits, GUARDRAIL_LIMITS__MAX_HITS)",
            )
        event = _validated(
            RetrievalEvent,
            "retrieval",
            {
                "request_id": request_id,
                "tenant": tenant,
                "collection": collection,
                "retriever": retriever,
                "query": query,
                "k": len(hit_fields) if k is None else k,
                "hits": hit_fields,
                "created_at": created_at,
            },
        )
        # the validated values: lax validation turns bytes into str, the header needs str
        record = self._record(self.retrieval_topic, event, event.tenant)
        with self._lock:
            rid = event.request_id
            finished = self._finished_at(rid)
            if finished is not None:  # the other half after the final: allowed once
                if finished[1]:
                    raise _reused("retrieval", rid, "its retrieval and final were sent")
                self._finished[rid] = (finished[0], True)
                return record
            state = self._state(rid)
            if state.retrieval_sent:
                raise _reused("retrieval", rid, "its retrieval was sent")
            state.retrieval_sent = True
            state.tenant = event.tenant
        return record

    def delta(self, request_id: str, text: str) -> OutgoingRecord[GenerationDelta]:
        """The next streamed piece of the answer (``seq`` is counted here)."""
        _require_str("generation.delta", "request_id", request_id)
        limits = self.limits
        with self._lock:
            if self._finished_at(request_id) is not None:
                raise _reused("generation.delta", request_id, "its final was sent")
            held = self._open.get(request_id)
            event = _validated(  # before the request is opened: a refused id opens nothing
                GenerationDelta,
                "generation.delta",
                {"request_id": request_id, "seq": held.next_seq if held else 0, "text": text},
            )
            state = held if held is not None else self._state(request_id)
            if state.next_seq >= limits.max_deltas:
                raise InvalidEventError(
                    "generation.delta",
                    f"more than {limits.max_deltas} deltas for request {request_id} "
                    "(SidecarLimits.max_deltas)",
                )
            streamed = state.streamed_chars + len(text)
            if streamed > limits.max_answer_chars:
                raise InvalidEventError(
                    "generation.delta",
                    f"the streamed answer would have {streamed} characters; the sidecar "
                    f"dead-letters more than {limits.max_answer_chars} "
                    "(SidecarLimits.max_answer_chars, GUARDRAIL_LIMITS__MAX_ANSWER_CHARS)",
                )
            record = self._record(self.generation_topic, event, state.tenant)
            state.next_seq += 1  # only once the event is good to send: no gap in seq
            state.streamed_chars = streamed
        return record

    def final(
        self,
        request_id: str,
        answer: str,
        *,
        attention: AttentionSummary | Any | None = None,
        logprob: float | None = None,
        generator_model: str | None = None,
    ) -> OutgoingRecord[GenerationFinal]:
        """The whole answer; ``attention`` is an ``AttentionSummary`` or an (L, H, K) array."""
        _require_str("generation.final", "request_id", request_id)
        _require_str("generation.final", "answer", answer)
        if len(answer) > self.limits.max_answer_chars:
            raise InvalidEventError(
                "generation.final",
                f"the answer has {len(answer)} characters; the sidecar dead-letters more than "
                f"{self.limits.max_answer_chars} (SidecarLimits.max_answer_chars, "
                "GUARDRAIL_LIMITS__MAX_ANSWER_CHARS)",
            )
        if attention is not None and not isinstance(attention, AttentionSummary):
            try:
                attention = AttentionSummary.from_array(attention)
            except (ValueError, TypeError, ValidationError) as exc:  # not array-like: TypeError
                raise InvalidEventError("generation.final", f"attention: {exc}") from None
        with self._lock:
            if self._finished_at(request_id) is not None:
                raise _reused("generation.final", request_id, "its final was sent")
            state = self._open.get(request_id, _OpenRequest())
            event = _validated(
                GenerationFinal,
                "generation.final",
                {
                    "request_id": request_id,
                    "answer": answer,
                    "generator_model": generator_model or self.generator_model,
                    "deltas": state.next_seq,
                    "attention": attention,
                    "mean_token_logprob": logprob,
                },
            )
            record = self._record(self.generation_topic, event, state.tenant)
            self._open.pop(request_id, None)
            self._finish(request_id, state.retrieval_sent)
        return record

    def _finished_at(self, request_id: str) -> tuple[float, bool] | None:
        """When ``request_id``'s final was sent (and whether its retrieval was), if within
        ``REUSE_MEMORY_S``; older ones are forgotten here."""
        now = self._clock()
        finished = self._finished
        while finished:
            oldest, (at, _) = next(iter(finished.items()))
            if now - at <= REUSE_MEMORY_S:
                break
            del finished[oldest]
        return finished.get(request_id)

    def _finish(self, request_id: str, retrieval_sent: bool) -> None:
        self._finished[request_id] = (self._clock(), retrieval_sent)
        while len(self._finished) > self.max_open_requests:
            self._finished.popitem(last=False)

    def _state(self, request_id: str) -> _OpenRequest:
        state = self._open.get(request_id)
        if state is None:
            state = self._open[request_id] = _OpenRequest()
            if len(self._open) > self.max_open_requests:
                forgotten, _ = self._open.popitem(last=False)
                log.warning(
                    "forgot open request %s: more than %d requests without a final "
                    "(max_open_requests); a later delta of it restarts at seq 0",
                    forgotten,
                    self.max_open_requests,
                )
        return state

    def _record(self, topic: str, event: E, tenant: str | None) -> OutgoingRecord[E]:
        headers = self._headers()
        if tenant is not None and self.tenant_header:
            headers.append((self.tenant_header, tenant.encode("utf-8")))
        value = encode(event)
        if len(value) > self.limits.max_message_bytes:
            raise InvalidEventError(
                event.event_type,
                f"the encoded event is {len(value)} bytes; the sidecar dead-letters more than "
                f"{self.limits.max_message_bytes} (SidecarLimits.max_message_bytes, "
                "GUARDRAIL_LIMITS__MAX_MESSAGE_BYTES)",
            )
        return OutgoingRecord(
            topic=topic,
            key=request_key(event.request_id),
            value=value,
            headers=tuple(headers),
            event=event,
        )
