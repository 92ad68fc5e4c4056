"""One message in, a ``Step`` out: what to publish, and which inputs are then finished.

The processor is the sidecar's pure core. It knows nothing of Kafka: the
adapter hands it bytes with an ``InputRef``, publishes the step's outputs in
order, waits for the broker to confirm them, and only then marks the step's
``done`` references as finished so their offsets may be committed.

Decisions recorded here (and tested):
  * bad input -> dead letter (original bytes + ``x-dlq-*`` headers), never a crash;
  * a half-request evicted by TTL or capacity -> a ``block`` verdict with reason
    ``incomplete`` (the caller always gets an answer; the inputs stay in Kafka);
  * an exact duplicate of an event already held -> finished without output;
  * a conflicting duplicate -> dead letter ``duplicate-conflict``;
  * an event for a request decided moments ago -> dead letter ``after-final``.
"""

from __future__ import annotations

import hashlib
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from sidecar import __version__
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind, decode_input, encode, request_id_hint
from sidecar.contracts.events import (
    AnswerVerdict,
    ClaimsSignal,
    ClaimVerdict,
    DeadLetterRecord,
    Decision,
    FeedbackEvent,
    GenerationDelta,
    GenerationFinal,
    LookbackSignal,
    Reason,
    RetrievalEvent,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import InputError
from sidecar.pipeline.join import InputRef, JoinStore, PendingRequest
from sidecar.pipeline.signals import (
    NOT_CONFIGURED_CLAIMS,
    NOT_CONFIGURED_LOOKBACK,
    NOT_CONFIGURED_RETRIEVAL,
    ClaimResult,
    ConfidenceResult,
    SignalSuite,
)
from sidecar.policy.base import Policy

log = logging.getLogger("sidecar.pipeline")

IDEMPOTENCY_HEADER = "x-idempotency-key"
MAX_DELTAS_PER_REQUEST = 100_000


class Destination(StrEnum):
    VERDICTS = "verdicts"
    CLAIMS = "claims"
    DLQ = "dlq"
    REPORTS = "reports"
    # hand-off at shutdown: an open request's inputs go back to the end of their topic
    RETRIEVAL = "retrieval"
    GENERATION = "generation"


HANDOFF_HEADER = "x-guardrail-handoff"


AttributeValue = str | bool | int | float | list[str]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """A finished span tree to export for one output (built by the adapter, not here).

    ``parent`` carries the upstream W3C trace context (the input's headers); the
    adapter writes the new span's context into the output's headers.
    """

    name: str
    parent: tuple[tuple[str, bytes], ...]
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    stages: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Output:
    destination: Destination
    key: bytes | None
    value: bytes
    headers: dict[str, str]
    trace: TraceRecord | None = None


@dataclass(slots=True)
class Step:
    outputs: list[Output] = field(default_factory=list)
    done: list[InputRef] = field(default_factory=list)

    def extend(self, other: Step) -> None:
        self.outputs.extend(other.outputs)
        self.done.extend(other.done)


@dataclass(slots=True)
class Counters:
    consumed: int = 0
    verdicts: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    incomplete: int = 0
    claim_verdicts: int = 0
    feedback: int = 0
    feedback_unmatched: int = 0
    reports: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def idempotency_key(request_id: str, *parts: bytes | None) -> str:
    """Same request and same input bytes -> same key, across restarts and instances."""
    h = hashlib.sha256(request_id.encode("utf-8"))
    for part in parts:
        h.update(b"\x00" + (part or b"-"))
    return h.hexdigest()[:32]


def _check_key(key: bytes | None, request_id: str, where: str) -> None:
    """Every topic the sidecar reads is keyed by request_id (co-partitioning relies on it)."""
    if key is not None and key != request_id.encode("utf-8"):
        raise InputError(
            "key-mismatch",
            f"message key {key[:64]!r} differs from request_id {request_id!r}; "
            f"{where} must be keyed by request_id",
        )


def _wall_clock() -> datetime:
    return datetime.now(UTC)


class Processor:
    """Joins, decides and dead-letters. Single-threaded; the adapter serialises calls."""

    def __init__(
        self,
        settings: Settings,
        policy: Policy,
        *,
        signals: SignalSuite | None = None,
        wall_clock: Callable[[], datetime] = _wall_clock,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._signals = signals or SignalSuite()
        self._wall_clock = wall_clock
        self.store = JoinStore(settings.join.max_entries, settings.join.ttl_ms)
        self.counters = Counters()
        self._deferred: list[PendingRequest] | None = None  # completed within ``on_batch``

    @property
    def signals(self) -> SignalSuite:
        return self._signals

    # ------------------------------------------------------------------ inputs

    def on_batch(
        self,
        items: Sequence[tuple[InputKind, bytes | None, bytes | None, InputRef]],
        now_ms: float,
    ) -> Step:
        """Handle a consumed batch; answers it completes are scored together.

        The lookback model runs once for every answer completed in the batch
        (micro-batching across concurrent requests); decisions follow in
        completion order.
        """
        self._deferred = []
        try:
            step = Step()
            for kind, raw, key, ref in items:
                try:
                    step.extend(self.on_message(kind, raw, key, ref, now_ms))
                except Exception as exc:  # a bug of ours must not lose the message
                    log.exception(
                        "internal error on %s[%d]@%d", ref.topic, ref.partition, ref.offset
                    )
                    detail = "".join(traceback.format_exception_only(exc)).strip()
                    step.extend(
                        self.dead_letter(raw, key, ref, InputError("internal-error", detail))
                    )
            deferred, self._deferred = self._deferred, None
        finally:
            self._deferred = None
        if not deferred:
            return step
        scores: list[LookbackSignal | None] = [None] * len(deferred)
        lookback = self._signals.lookback
        if lookback is not None:
            pairs = [
                (e.final, e.certification or NOT_CONFIGURED_RETRIEVAL)
                for e in deferred
                if e.final is not None
            ]
            try:
                scores[:] = lookback.score_batch(pairs)
            except Exception:
                log.exception("batched lookback scoring failed; scoring one by one")
        for entry, score in zip(deferred, scores, strict=True):
            step.extend(self._decide(entry, now_ms, lookback=score))
        return step

    def on_message(
        self,
        kind: InputKind,
        raw: bytes | None,
        key: bytes | None,
        ref: InputRef,
        now_ms: float,
    ) -> Step:
        """Handle one consumed message. Never raises for bad input."""
        self.counters.consumed += 1
        limits = self._settings.limits
        try:
            event = decode_input(
                kind, raw, max_bytes=limits.max_message_bytes, max_depth=limits.max_json_depth
            )
            if isinstance(event, FeedbackEvent):
                return self._feedback(event, key, ref)
            self._admit(event, key, now_ms)
            if isinstance(event, RetrievalEvent):
                self._check_tenant(event, ref)
        except InputError as exc:
            return self.dead_letter(raw, key, ref, exc)
        step = Step()
        entry, evicted = self.store.open(event.request_id, now_ms)
        if evicted is not None:
            step.extend(self._incomplete(evicted, "capacity", now_ms))
        try:
            self._hold(entry, event, raw or b"")
        except InputError as exc:
            if not entry.refs:  # a fresh entry that holds nothing: do not keep it open
                self.store.discard(entry.request_id)
            step.extend(self.dead_letter(raw, key, ref, exc))
            return step
        entry.refs.append(ref)
        entry.raws.append((key, raw or b""))
        if entry.complete and self._deferred is not None:
            if entry not in self._deferred:
                self._deferred.append(entry)
        elif entry.complete:
            step.extend(self._decide(entry, now_ms))
        else:
            step.extend(self._stream_claims(entry))
        return step

    def _admit(
        self,
        event: RetrievalEvent | GenerationDelta | GenerationFinal,
        key: bytes | None,
        now_ms: float,
    ) -> None:
        """Checks that need the message's envelope or the store, not just its body."""
        _check_key(key, event.request_id, "input topics")
        if self.store.get(event.request_id) is None and self.store.was_closed(
            event.request_id, now_ms
        ):
            raise InputError(
                "after-final",
                f"request {event.request_id} was already decided; "
                f"this {event.event_type} event arrived too late",
            )

    def _feedback(self, event: FeedbackEvent, key: bytes | None, ref: InputRef) -> Step:
        """A labelled outcome: folded into the coverage bound; nothing is published."""
        _check_key(key, event.request_id, "the feedback topic")
        self.counters.feedback += 1
        coverage = self._signals.coverage
        if coverage is None or not coverage.observe_feedback(event):
            self.counters.feedback_unmatched += 1
        return Step(done=[ref])

    def _check_tenant(self, event: RetrievalEvent, ref: InputRef) -> None:
        """The tenant selects calibration and policy: only a trusted source may name it."""
        tenancy = self._settings.tenancy
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

    def _hold(
        self,
        entry: PendingRequest,
        event: RetrievalEvent | GenerationDelta | GenerationFinal,
        raw: bytes,
    ) -> None:
        if isinstance(event, RetrievalEvent):
            t0 = time.time_ns()
            certification = (
                self._signals.certifier.certify(event)
                if self._signals.certifier is not None
                else NOT_CONFIGURED_RETRIEVAL
            )
            self._hold_retrieval(entry, event, raw)
            entry.certification = certification
            entry.stages.append(("certify", t0, time.time_ns()))
        elif isinstance(event, GenerationDelta):
            self._hold_delta(entry, event)
        else:
            if self._signals.lookback is not None:
                self._signals.lookback.check(event)
            self._hold_final(entry, event, raw)

    def _hold_retrieval(self, entry: PendingRequest, event: RetrievalEvent, raw: bytes) -> None:
        digest = _digest(raw)
        if entry.retrieval is not None:
            self._duplicate(entry.retrieval_digest == digest, "retrieval", event.request_id)
        entry.retrieval, entry.retrieval_digest = event, digest

    def _hold_final(self, entry: PendingRequest, event: GenerationFinal, raw: bytes) -> None:
        digest = _digest(raw)
        if entry.final is not None:
            self._duplicate(entry.final_digest == digest, "generation.final", event.request_id)
        entry.final, entry.final_digest = event, digest

    def _hold_delta(self, entry: PendingRequest, event: GenerationDelta) -> None:
        if entry.final is not None:
            raise InputError("after-final", f"delta seq={event.seq} arrived after the final event")
        held = entry.deltas.get(event.seq)
        if held is not None:
            self._duplicate(held == event.text, f"delta seq={event.seq}", event.request_id)
        if len(entry.deltas) >= MAX_DELTAS_PER_REQUEST:
            raise InputError(
                "too-many-deltas", f"more than {MAX_DELTAS_PER_REQUEST} deltas for one request"
            )
        entry.add_delta(event.seq, event.text)

    def _stream_claims(self, entry: PendingRequest) -> Step:
        """Feed newly streamed text to the claim checker; publish completed claims."""
        checker = self._signals.claims
        if checker is None or entry.retrieval is None:
            return Step()
        if entry.claims is None:
            entry.claims = checker.open(
                entry.retrieval, entry.certification or NOT_CONFIGURED_RETRIEVAL
            )
        new_text = entry.streamed[entry.claims_fed :]
        if not new_text:
            return Step()
        entry.claims_fed = len(entry.streamed)
        t0 = time.time_ns()
        try:
            results = entry.claims.feed(new_text)
        except Exception:
            log.exception("streaming claim verification failed for %s", entry.request_id)
            return Step()
        span = (t0, time.time_ns())
        entry.claim_results.extend(results)
        step = Step(outputs=[self._claim_output(entry, r, span) for r in results])
        if results and not entry.stream_blocked:
            step.outputs.extend(self._strict_check(entry))
        return step

    def _strict_check(self, entry: PendingRequest) -> list[Output]:
        """Strict profiles: an early ``block`` verdict the moment a claim is unsupported."""
        assert entry.retrieval is not None  # noqa: S101 - claims need the retrieval
        outcome = self._policy.check_stream(
            entry.retrieval, entry.claim_results, entry.certification
        )
        if outcome is None:
            return []
        entry.stream_blocked = True
        verdict = AnswerVerdict(
            request_id=entry.request_id,
            idempotency_key=idempotency_key(
                entry.request_id, b"stream", str(len(entry.claim_results)).encode()
            ),
            tenant=entry.retrieval.tenant,
            decision=outcome.decision,
            reasons=outcome.reasons,
            stage="stream",
            escalate=outcome.escalate,
            policy=self._policy.name,
            caveat_text=outcome.caveat_text,
            rewritten_answer=outcome.rewritten_answer,
            produced_at=self._wall_clock(),
            sidecar_version=__version__,
        )
        self.counters.verdicts += 1
        return [
            Output(
                destination=Destination.VERDICTS,
                key=entry.request_id.encode("utf-8"),
                value=encode(verdict),
                headers={IDEMPOTENCY_HEADER: verdict.idempotency_key},
            )
        ]

    def _claim_output(
        self, entry: PendingRequest, result: ClaimResult, span_ns: tuple[int, int]
    ) -> Output:
        checker = self._signals.claims
        assert checker is not None  # noqa: S101 - only called with a checker
        self.counters.claim_verdicts += 1
        entry.claims_published += 1
        verdict = ClaimVerdict(
            request_id=entry.request_id,
            idempotency_key=idempotency_key(
                entry.request_id, b"claim", str(result.index).encode(), result.text.encode()
            ),
            claim_index=result.index,
            span=result.span,
            text=result.text,
            label=result.label,
            score=result.score,
            evidence_chunk_ids=list(result.evidence_chunk_ids),
            verifier_version=checker.version,
            produced_at=self._wall_clock(),
        )
        trace = TraceRecord(
            name="sidecar.verify_claim",
            parent=entry.trace_parent(),
            start_ns=span_ns[0],
            end_ns=span_ns[1],
            attributes={
                "request_id": entry.request_id,
                "claim.index": result.index,
                "claim.label": result.label.value,
                "claim.score": result.score,
                "verifier.version": checker.version,
            },
        )
        return Output(
            destination=Destination.CLAIMS,
            key=entry.request_id.encode("utf-8"),
            value=encode(verdict),
            headers={IDEMPOTENCY_HEADER: verdict.idempotency_key},
            trace=trace,
        )

    def _duplicate(self, identical: bool, what: str, request_id: str) -> None:
        if identical:
            self.counters.duplicates += 1
            raise _ExactDuplicate
        raise InputError(
            "duplicate-conflict",
            f"a second {what} for request {request_id} with different content",
        )

    # ------------------------------------------------------------------ time

    def on_tick(self, now_ms: float) -> Step:
        """Expire half-requests older than the TTL into ``incomplete`` verdicts."""
        step = Step()
        for entry in self.store.expire(now_ms):
            step.extend(self._incomplete(entry, "ttl", now_ms))
        coverage = self._signals.coverage
        if coverage is not None:
            for report in coverage.due_reports(now_ms):
                self.counters.reports += 1
                step.outputs.append(
                    Output(
                        destination=Destination.REPORTS,
                        key=report.calibration_key.encode("utf-8"),
                        value=encode(report),
                        headers={},
                    )
                )
        return step

    def handoff(self) -> Step:
        """Graceful shutdown: give every open request back to the topics, unchanged.

        Each held input is re-published (same key, so the same partition; same
        bytes, so the same idempotency key) to the end of its input topic and the
        originals are finished, so every partition can be committed to its end.
        Whoever owns the partition next completes the join: no verdict is lost and
        none is produced twice, although half-requests are still open.
        """
        step = Step()
        for entry in self.store.drain():
            for ref, (key, raw) in zip(entry.refs, entry.raws, strict=True):
                destination = (
                    Destination.RETRIEVAL
                    if ref.topic == self._settings.topics.retrieval
                    else Destination.GENERATION
                )
                headers = {
                    name: value.decode("utf-8", errors="replace")
                    for name, value in ref.headers
                    if name != HANDOFF_HEADER
                }
                headers[HANDOFF_HEADER] = f"{ref.topic}:{ref.partition}:{ref.offset}"
                step.outputs.append(Output(destination, key, raw, headers))
            step.done.extend(entry.refs)
        return step

    # ------------------------------------------------------------------ outputs

    def _decide(
        self, entry: PendingRequest, now_ms: float, lookback: LookbackSignal | None = None
    ) -> Step:
        assert entry.retrieval is not None  # noqa: S101 - guarded by entry.complete
        assert entry.final is not None  # noqa: S101
        started = time.perf_counter()
        t_join = time.time_ns()
        entry.stages.append(("join", entry.first_seen_ns, t_join))
        self.store.close(entry.request_id, now_ms)
        step = self._stream_claims(entry)
        certification = entry.certification or NOT_CONFIGURED_RETRIEVAL
        t_score = time.time_ns()
        if lookback is not None:
            pass  # scored with the rest of its batch
        elif self._signals.lookback is None:
            lookback = NOT_CONFIGURED_LOOKBACK
        else:
            try:
                lookback = self._signals.lookback.score(entry.final, certification)
            except Exception:
                log.exception("lookback scoring failed for %s", entry.request_id)
                lookback = LookbackSignal(status=SignalStatus.UNAVAILABLE)
        t_claims = time.time_ns()
        entry.stages.append(("score", t_score, t_claims))
        claims = NOT_CONFIGURED_CLAIMS
        if entry.claims is not None:
            try:
                tail, claims = entry.claims.finish(entry.final.answer)
                span = (t_claims, time.time_ns())
                entry.claim_results.extend(tail)
                step.outputs.extend(self._claim_output(entry, r, span) for r in tail)
            except Exception:
                log.exception("claim verification failed for %s", entry.request_id)
                claims = ClaimsSignal(status=SignalStatus.UNAVAILABLE)
        signals = Signals(retrieval=certification, lookback=lookback, claims=claims)
        confidence = self._confidence(entry, signals)
        scored = time.perf_counter()
        t_policy = time.time_ns()
        entry.stages.append(("verify_claims", t_claims, t_policy))
        outcome = self._policy.decide(
            entry.retrieval,
            entry.final,
            signals,
            claims=(
                getattr(entry.claims, "results", entry.claim_results)
                if entry.claims is not None
                else None
            ),
            confidence=confidence.p_correct if confidence else None,
        )
        entry.stages.append(("policy", t_policy, time.time_ns()))
        key = idempotency_key(entry.request_id, entry.retrieval_digest, entry.final_digest)
        timings = {
            "join_wait": max(0.0, now_ms - entry.first_seen_ms),
            "signals": (scored - started) * 1000.0,
            "policy": (time.perf_counter() - scored) * 1000.0,
        }
        verdict = AnswerVerdict(
            request_id=entry.request_id,
            idempotency_key=key,
            tenant=entry.retrieval.tenant,
            decision=outcome.decision,
            reasons=outcome.reasons,
            escalate=outcome.escalate,
            policy=self._policy.name,
            signals=signals,
            confidence=confidence.p_correct if confidence else None,
            confidence_features=confidence.features if confidence else {},
            chunk_forecast=list(confidence.chunk_forecast) if confidence else [],
            advice=confidence.advice if confidence else None,
            caveat_text=outcome.caveat_text,
            rewritten_answer=outcome.rewritten_answer,
            model_versions={"generator": entry.final.generator_model, **self._signals.versions()},
            timings_ms=timings,
            produced_at=self._wall_clock(),
            sidecar_version=__version__,
        )
        if self._signals.coverage is not None:
            self._signals.coverage.observe_verdict(verdict)
        step.extend(self._verdict_step(verdict, entry))
        return step

    def _confidence(self, entry: PendingRequest, signals: Signals) -> ConfidenceResult | None:
        scorer = self._signals.confidence
        if scorer is None:
            return None
        assert entry.retrieval is not None  # noqa: S101 - only called by _decide
        assert entry.final is not None  # noqa: S101
        try:
            return scorer.score(entry.retrieval, entry.final, signals)
        except Exception:
            log.exception("confidence scoring failed for %s", entry.request_id)
            return None

    def _incomplete(self, entry: PendingRequest, why: str, now_ms: float) -> Step:
        self.counters.incomplete += 1
        missing = entry.missing()
        self.store.close(entry.request_id, now_ms)
        verdict = AnswerVerdict(
            request_id=entry.request_id,
            idempotency_key=idempotency_key(
                entry.request_id, b"incomplete", entry.retrieval_digest, entry.final_digest
            ),
            tenant=entry.retrieval.tenant if entry.retrieval else None,
            decision=Decision.BLOCK,
            reasons=[
                Reason(
                    code="incomplete",
                    message=(
                        f"request evicted from the join store ({why}) before it was complete; "
                        f"missing: {', '.join(missing) or 'nothing'}"
                    ),
                    signal="pipeline",
                )
            ],
            policy=self._policy.name,
            produced_at=self._wall_clock(),
            sidecar_version=__version__,
        )
        return self._verdict_step(verdict, entry)

    def _verdict_step(self, verdict: AnswerVerdict, entry: PendingRequest) -> Step:
        self.counters.verdicts += 1
        trace = TraceRecord(
            name="sidecar.request",
            parent=entry.trace_parent(),
            start_ns=entry.first_seen_ns,
            end_ns=time.time_ns(),
            attributes={
                "request_id": verdict.request_id,
                "tenant": verdict.tenant or "",
                "decision": verdict.decision.value,
                "reasons": [r.code for r in verdict.reasons],
                "policy": verdict.policy,
                **{f"model.{k}": v for k, v in verdict.model_versions.items()},
            },
            stages=tuple(entry.stages),
        )
        out = Output(
            destination=Destination.VERDICTS,
            key=verdict.request_id.encode("utf-8"),
            value=encode(verdict),
            headers={IDEMPOTENCY_HEADER: verdict.idempotency_key},
            trace=trace,
        )
        return Step(outputs=[out], done=list(entry.refs))

    def dead_letter(
        self, raw: bytes | None, key: bytes | None, ref: InputRef, exc: InputError
    ) -> Step:
        if isinstance(exc, _ExactDuplicate):
            return Step(done=[ref])
        self.counters.dead_letters += 1
        reasons = self.counters.dead_letter_reasons
        reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
        record = DeadLetterRecord(
            reason=exc.reason,
            detail=exc.detail[:2000],
            source_topic=ref.topic,
            source_partition=ref.partition,
            source_offset=ref.offset,
            request_id=request_id_hint(raw, key),
            failed_at=self._wall_clock(),
            sidecar_version=__version__,
        )
        headers = {
            name: value.decode("utf-8", errors="replace")
            for name, value in ref.headers
            if not name.startswith("x-dlq-")
        }
        headers.update(record.to_headers())
        out = Output(destination=Destination.DLQ, key=key, value=raw or b"", headers=headers)
        return Step(outputs=[out], done=[ref])


class _ExactDuplicate(InputError):
    """An identical copy of an event already held: finished, nothing to publish."""

    def __init__(self) -> None:
        super().__init__("duplicate", "identical duplicate")
