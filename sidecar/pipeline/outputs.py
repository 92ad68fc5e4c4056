"""Pure builders of everything the sidecar publishes: verdicts, claim verdicts, dead letters.

Nothing here reads a clock, a store or a setting: every builder takes the
values it needs (the time included) and returns an ``Output`` — the value,
its key and headers, its destination and, for traced outputs, the span to
export. ``idempotency_key`` makes a replay recognisable: the same request and
the same input bytes give the same key on any instance, after any restart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sidecar import __version__
from sidecar.contracts.codec import encode, request_id_hint
from sidecar.contracts.events import (
    AnswerVerdict,
    ClaimVerdict,
    CoverageReport,
    DeadLetterRecord,
    Decision,
    Reason,
)
from sidecar.exceptions import InputError
from sidecar.pipeline.join import InputRef, PendingRequest
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome

IDEMPOTENCY_HEADER = "x-idempotency-key"
MAX_DLQ_DETAIL_CHARS = 2_000


class Destination(StrEnum):
    VERDICTS = "verdicts"
    CLAIMS = "claims"
    DLQ = "dlq"
    REPORTS = "reports"


AttributeValue = str | bool | int | float | list[str]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """A finished span tree to export for one output (exported by the adapter, not here).

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
    """The idempotency key of a complete request's final verdict."""
    return idempotency_key(entry.request_id, entry.retrieval_digest, entry.final_digest)


def incomplete_key(entry: PendingRequest) -> str:
    return idempotency_key(
        entry.request_id, b"incomplete", entry.retrieval_digest, entry.final_digest
    )


def verdict_output(verdict: AnswerVerdict, entry: PendingRequest, end_ns: int) -> Step:
    """A final (or incomplete) verdict; publishing it finishes every input of the request."""
    trace = TraceRecord(
        name="sidecar.request",
        parent=entry.trace_parent(),
        start_ns=entry.first_seen_ns,
        end_ns=end_ns,
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


def incomplete_verdict(
    entry: PendingRequest, why: str, *, policy: str, produced_at: datetime
) -> AnswerVerdict:
    """``block`` / ``incomplete``: the caller always gets an answer, naming what never came."""
    missing = entry.missing()
    return AnswerVerdict(
        request_id=entry.request_id,
        idempotency_key=incomplete_key(entry),
        tenant=entry.retrieval.tenant if entry.retrieval else entry.tenant,
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
            entry.request_id, b"failed", entry.retrieval_digest, entry.final_digest
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
        idempotency_key=idempotency_key(entry.request_id, b"stream", str(claims_so_far).encode()),
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
        headers={IDEMPOTENCY_HEADER: verdict.idempotency_key},
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
            idempotency_key=idempotency_key(
                entry.request_id, b"claim", str(result.index).encode(), result.text.encode()
            ),
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
            name="sidecar.verify_claim",
            parent=entry.trace_parent(),
            start_ns=span_ns[0],
            end_ns=span_ns[1],
            attributes={
                "request_id": entry.request_id,
                "claim.index": result.index,
                "claim.label": result.label.value,
                "claim.score": result.score,
                "verifier.version": verifier_version,
            },
        )
        outputs.append(
            Output(
                destination=Destination.CLAIMS,
                key=entry.request_id.encode("utf-8"),
                value=encode(verdict),
                headers={IDEMPOTENCY_HEADER: verdict.idempotency_key},
                trace=trace,
            )
        )
    return outputs


def report_output(report: CoverageReport) -> Output:
    return Output(
        destination=Destination.REPORTS,
        key=report.calibration_key.encode("utf-8"),
        value=encode(report),
        headers={},
    )


def dead_letter_output(
    raw: bytes | None,
    key: bytes | None,
    ref: InputRef,
    error: InputError,
    *,
    failed_at: datetime,
) -> Output:
    """The original bytes, key and headers, plus ``x-dlq-*`` headers naming the reason."""
    record = DeadLetterRecord(
        reason=error.reason,
        detail=error.detail[:MAX_DLQ_DETAIL_CHARS],
        source_topic=ref.topic,
        source_partition=ref.partition,
        source_offset=ref.offset,
        request_id=request_id_hint(raw, key),
        failed_at=failed_at,
        sidecar_version=__version__,
    )
    headers = {
        name: value.decode("utf-8", errors="replace")
        for name, value in ref.headers
        if not name.startswith("x-dlq-")
    }
    headers.update(record.to_headers())
    return Output(destination=Destination.DLQ, key=key, value=raw or b"", headers=headers)
