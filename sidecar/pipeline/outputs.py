"""Pure builders of the records the sidecar publishes: answer verdicts, claim verdicts, reports.

Nothing here reads a clock, a store or a setting: every builder takes the
values it needs (the time included) and returns an ``Output`` — the value,
its key and headers, its destination and, for traced outputs, the span to
export. ``idempotency_key`` makes a replay recognisable: the same request and
the same input bytes give the same key on any instance, after any restart.
Dead letters are built by :mod:`sidecar.pipeline.deadletters`.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sidecar import __version__
from sidecar.contracts.codec import InputKind, encode
from sidecar.contracts.events import (
    AnswerVerdict,
    CertificateWithdrawal,
    ClaimVerdict,
    CoverageReport,
    Decision,
    Reason,
)
from sidecar.contracts.reasons import PROFILE_REASON_PREFIX
from sidecar.pipeline.join import REROUTED_HEADER, InputRef, PendingRequest
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome

IDEMPOTENCY_HEADER = "x-idempotency-key"

Header = tuple[str, bytes]


class Destination(StrEnum):
    VERDICTS = "verdicts"
    CLAIMS = "claims"
    DLQ = "dlq"
    REPORTS = "reports"
    CERTIFICATES = "certificates"
    # the input topics, for a record rerouted to its request's partition (``join.reroute``)
    RETRIEVAL = "retrieval"
    GENERATION = "generation"
    FEEDBACK = "feedback"


INPUT_DESTINATIONS = frozenset(
    {Destination.RETRIEVAL, Destination.GENERATION, Destination.FEEDBACK}
)


AttributeValue = str | bool | int | float | list[str]
_VERDICTS = Destination.VERDICTS  # one global read a verdict


# TraceRecord and Output are not frozen: one of each is built per output, and a frozen
# dataclass's __init__ (an object.__setattr__ per field) cost ~1.5 us each. Nothing changes
# them once built (the adapter publishes and exports them as they are).
@dataclass(slots=True)
class TraceRecord:
    """A finished span tree to export for one output (exported by the adapter, not here).

    ``parent`` carries the upstream W3C trace context (the input's headers); the
    adapter writes the new span's context into the output's headers. ``start_ns``,
    ``end_ns`` and the stages' times are monotonic ns (``time.monotonic_ns``): stage
    durations are their differences, and the adapter puts the spans on the wall clock
    when it opens them.
    """

    name: str
    parent: tuple[tuple[str, bytes], ...]
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    stages: tuple[tuple[str, int, int], ...] = ()
    # a verdict's answer: the final event's Kafka timestamp (epoch ns; 0: none), from which
    # the broker's confirmation of the verdict is timed (stage answer_to_verdict)
    answered_ns: int = 0
    # other inputs' trace context headers, in other traces than ``parent``'s: linked
    links: tuple[tuple[tuple[str, bytes], ...], ...] = ()


@dataclass(slots=True)
class Output:
    """One record to publish. ``headers`` are (name, bytes) pairs in order, duplicates kept."""

    destination: Destination
    key: bytes | None
    value: bytes
    headers: list[Header]
    trace: TraceRecord | None = None

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (``None``: absent)."""
        found = [value for key, value in self.headers if key == name]
        return found[-1] if found else None


def utf8_headers(headers: dict[str, str]) -> list[Header]:
    return [(name, value.encode("utf-8")) for name, value in headers.items()]


@dataclass(slots=True)
class Step:
    """What to publish, in order, and which inputs are finished once it is confirmed."""

    outputs: list[Output] = field(default_factory=list)
    done: list[InputRef] = field(default_factory=list)

    def extend(self, other: Step) -> None:
        self.outputs.extend(other.outputs)
        self.done.extend(other.done)


def idempotency_key(request_id: str, *parts: bytes | None) -> str:
    """Same request and same input bytes -> same key, across restarts and instances."""
    h = hashlib.sha256(request_id.encode("utf-8"))
    for part in parts:
        h.update(b"\x00" + (part or b"-"))
    return h.hexdigest()[:32]


def answer_key(entry: PendingRequest) -> str:
    """The idempotency key of a complete request's final verdict: ``idempotency_key`` of
    its id and both digests, hashed as one joined buffer (the same bytes, in one call)."""
    return hashlib.sha256(
        b"\x00".join(
            (
                entry.request_id.encode("utf-8"),
                entry.retrieval_digest or b"-",
                entry.final_digest or b"-",
            )
        )
    ).hexdigest()[:32]


def incomplete_key(entry: PendingRequest) -> str:
    """An incomplete request's key; the store key scopes it by the trusted tenant: two
    tenants' final-only requests with one id and the same bytes had one key (audit)."""
    return idempotency_key(
        entry.request_id,
        b"incomplete",
        entry.store_key.encode("utf-8"),
        entry.retrieval_digest,
        entry.final_digest,
    )


def verdict_attributes(verdict: AnswerVerdict) -> dict[str, AttributeValue]:
    """The verdict's trace attributes (``guardrail.*``), which its metrics are counted from.

    ``guardrail.profile``: the risk profile that decided, taken from the policy's
    ``profile.<name>`` reason (``none``: no profile decided, e.g. an incomplete
    request); ``guardrail.reasons`` are the other reasons' codes.
    """
    return answer_attributes(
        request_id=verdict.request_id,
        tenant=verdict.tenant,
        decision=verdict.decision,
        stage=verdict.stage,
        reasons=verdict.reasons,
        policy=verdict.policy,
        models=model_attributes(verdict.model_versions),
    )


def model_attributes(model_versions: dict[str, str]) -> dict[str, AttributeValue]:
    """``guardrail.model.<name>``: each model version as a trace attribute, in order."""
    return {model_attribute(k): v for k, v in model_versions.items()}


def answer_attributes(
    *,
    request_id: str,
    tenant: str | None,
    decision: Decision,
    stage: str,
    reasons: Sequence[Reason],
    policy: str,
    models: dict[str, AttributeValue],
) -> dict[str, AttributeValue]:
    """:func:`verdict_attributes` from the verdict's values (no model needed); ``models``:
    :func:`model_attributes` of its model versions (the processor builds the batch's once)."""
    profile = None
    codes: list[str] = []
    for reason in reasons:
        code = reason.code
        if not code.startswith(PROFILE_REASON_PREFIX):
            codes.append(code)
        elif profile is None:
            profile = code.removeprefix(PROFILE_REASON_PREFIX)
    return {
        "guardrail.request_id": request_id,
        "guardrail.tenant": tenant or "",
        "guardrail.decision": decision.value,
        "guardrail.stage": stage,
        "guardrail.profile": "none" if profile is None else profile,
        "guardrail.reasons": codes,
        "guardrail.policy": policy,
        **models,
    }


@functools.lru_cache(maxsize=256)  # names are the sidecar's own (a handful); bounded all the same
def model_attribute(name: str) -> str:
    """``guardrail.model.<name>``, formatted once per name (five f-strings a verdict, before)."""
    return f"guardrail.model.{name}"


def verdict_output(verdict: AnswerVerdict, entry: PendingRequest, end_ns: int) -> Step:
    """A final (or incomplete) verdict; publishing it finishes every input of the request."""
    return answer_output(
        entry,
        encode(verdict),
        verdict.idempotency_key,
        attributes=verdict_attributes(verdict),
        end_ns=end_ns,
    )


def answer_output(
    entry: PendingRequest,
    value: bytes,
    idempotency_key: str,
    *,
    attributes: dict[str, AttributeValue],
    end_ns: int,
) -> Step:
    """:func:`verdict_output` of a verdict already encoded (``answer_verdict_json``)."""
    parent = entry.trace_parent()
    trace = TraceRecord(
        "guardrail.request",
        parent,
        entry.first_seen_ns,
        end_ns,
        attributes,
        tuple(entry.stages),
        max(0, entry.final_timestamp_ms) * 1_000_000,
        # no parent: no input's trace context could be read, so none is linked either
        entry.trace_links(parent) if parent else (),
    )
    out = Output(
        _VERDICTS,
        entry.request_id.encode("utf-8"),
        value,
        [(IDEMPOTENCY_HEADER, idempotency_key.encode("utf-8"))],
        trace,
    )
    return Step([out], list(entry.refs))


def incomplete_verdict(
    entry: PendingRequest, why: str, *, policy: str, produced_at: datetime
) -> AnswerVerdict:
    """``block`` / ``incomplete``: the caller always gets an answer, naming what never came
    (and the dead letter that left the request unable to complete, when there was one, and
    an input that came on another partition than its request id hashes to)."""
    missing = ", ".join(entry.missing()) or "nothing"
    if entry.refused is None:
        message = (
            f"request evicted from the join store ({why}) before it was complete; "
            f"missing: {missing}"
        )
    else:
        reason, detail = entry.refused
        message = (
            f"request cannot complete: its {' and '.join(sorted(entry.refused_parts))} "
            f"{'was' if len(entry.refused_parts) == 1 else 'were'} dead-lettered "
            f"({reason}: {detail}); missing: {missing}"
        )
    if entry.misrouted is not None:  # its halves may be read by two replicas: say why
        topic, partition, home = entry.misrouted
        message += (
            f"; its input on {topic}[{partition}] belongs on partition {home} (murmur2 of "
            "its request id): a producer does not use Kafka's default partitioner "
            "(librdkafka: set partitioner=murmur2_random), so the rest may have gone to "
            "another replica"
        )
    return AnswerVerdict(
        request_id=entry.request_id,
        idempotency_key=incomplete_key(entry),
        tenant=entry.retrieval.tenant if entry.retrieval else entry.tenant,
        decision=Decision.BLOCK,
        reasons=[
            Reason(
                code="incomplete",
                message=message,
                signal="pipeline",
            )
        ],
        policy=policy,
        produced_at=produced_at,
        sidecar_version=__version__,
    )


def failed_verdict(
    entry: PendingRequest, detail: str, *, policy: str, produced_at: datetime
) -> AnswerVerdict:
    """``block`` / ``internal-error``: deciding this request failed; it alone pays for it."""
    return AnswerVerdict(
        request_id=entry.request_id,
        idempotency_key=idempotency_key(
            entry.request_id,
            b"failed",
            entry.store_key.encode("utf-8"),
            entry.retrieval_digest,
            entry.final_digest,
        ),
        tenant=entry.retrieval.tenant if entry.retrieval else entry.tenant,
        decision=Decision.BLOCK,
        reasons=[
            Reason(
                code="internal-error",
                message=f"the sidecar could not decide this answer: {detail[:500]}",
                signal="pipeline",
            )
        ],
        escalate=True,
        policy=policy,
        produced_at=produced_at,
        sidecar_version=__version__,
    )


def stream_block_output(
    entry: PendingRequest,
    outcome: PolicyOutcome,
    *,
    policy: str,
    claims_so_far: int,
    produced_at: datetime,
) -> Output:
    """Strict profiles: an early ``block`` the moment a streamed claim demands it."""
    verdict = AnswerVerdict(
        request_id=entry.request_id,
        idempotency_key=idempotency_key(
            entry.request_id,
            b"stream",
            entry.store_key.encode("utf-8"),
            entry.retrieval_digest,
            str(claims_so_far).encode(),
        ),
        tenant=entry.retrieval.tenant if entry.retrieval else entry.tenant,
        decision=outcome.decision,
        reasons=outcome.reasons,
        stage="stream",
        escalate=outcome.escalate,
        policy=policy,
        caveat_text=outcome.caveat_text,
        rewritten_answer=outcome.rewritten_answer,
        produced_at=produced_at,
        sidecar_version=__version__,
    )
    return Output(
        destination=Destination.VERDICTS,
        key=entry.request_id.encode("utf-8"),
        value=encode(verdict),
        headers=utf8_headers({IDEMPOTENCY_HEADER: verdict.idempotency_key}),
        trace=TraceRecord(
            name="guardrail.stream_block",
            parent=entry.trace_parent(),
            start_ns=entry.first_seen_ns,
            end_ns=time.monotonic_ns(),
            attributes=verdict_attributes(verdict),
        ),
    )


def claim_outputs(
    entry: PendingRequest,
    results: Sequence[ClaimResult],
    *,
    verifier_version: str,
    span_ns: tuple[int, int],
    produced_at: datetime,
) -> list[Output]:
    """One ``ClaimVerdict`` per result, each traced as a child of the request's context."""
    outputs = []
    for result in results:
        verdict = ClaimVerdict(
            request_id=entry.request_id,
            # the store key scopes it by tenant, the retrieval's digest by evidence: another
            # tenant's events under this request id never repeat this request's keys
            idempotency_key=idempotency_key(
                entry.request_id,
                b"claim",
                entry.store_key.encode("utf-8"),
                entry.retrieval_digest,
                str(result.index).encode(),
                result.text.encode(),
            ),
            tenant=entry.retrieval.tenant if entry.retrieval else entry.tenant,
            claim_index=result.index,
            span=result.span,
            text=result.text,
            label=result.label,
            score=result.score,
            evidence_chunk_ids=list(result.evidence_chunk_ids),
            verifier_version=verifier_version,
            produced_at=produced_at,
        )
        trace = TraceRecord(
            name="guardrail.verify_claim",
            parent=entry.trace_parent(),
            start_ns=span_ns[0],
            end_ns=span_ns[1],
            attributes={
                "guardrail.request_id": entry.request_id,
                "guardrail.claim.index": result.index,
                "guardrail.claim.label": result.label.value,
                "guardrail.claim.score": result.score,
                "guardrail.verifier.version": verifier_version,
            },
        )
        outputs.append(
            Output(
                destination=Destination.CLAIMS,
                key=entry.request_id.encode("utf-8"),
                value=encode(verdict),
                headers=utf8_headers({IDEMPOTENCY_HEADER: verdict.idempotency_key}),
                trace=trace,
            )
        )
    return outputs


def report_output(report: CoverageReport) -> Output:
    return Output(
        destination=Destination.REPORTS,
        key=report.calibration_key.encode("utf-8"),
        value=encode(report),
        headers=[],
    )


def withdrawal_output(withdrawal: CertificateWithdrawal) -> Output:
    """On the compacted ``rag.certificates``: keyed by the calibration key."""
    return Output(
        destination=Destination.CERTIFICATES,
        key=withdrawal.calibration_key.encode("utf-8"),
        value=encode(withdrawal),
        headers=[],
    )


def rerouted_output(kind: InputKind, raw: bytes | None, request_id: str, ref: InputRef) -> Output:
    """A record read off its request's murmur2 partition, as it came (bytes and headers),
    keyed by its request id, for its own topic: the producer's default partitioner
    (murmur2, as Kafka's) puts it on the partition the request's other half is read from.
    ``REROUTED_HEADER`` names the record it was made of."""
    origin = f"{ref.topic}/{ref.partition}/{ref.offset}".encode()
    return Output(
        destination=Destination(kind.value),
        key=request_id.encode("utf-8"),
        value=raw or b"",
        headers=[*ref.headers, (REROUTED_HEADER, origin)],
    )
