"""Pure builders of everything the sidecar publishes: verdicts, claim verdicts, dead letters.

Nothing here reads a clock, a store or a setting: every builder takes the
values it needs (the time included) and returns an ``Output`` — the value,
its key and headers, its destination and, for traced outputs, the span to
export. ``idempotency_key`` makes a replay recognisable: the same request and
the same input bytes give the same key on any instance, after any restart.

Header values are bytes from end to end: a dead letter carries the original
headers byte for byte (never decoded and re-encoded, which would turn one
invalid byte into three), and a dead letter that would not fit into its topic is
cut down by ``fit_dead_letter`` instead of being retried forever.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from sidecar import __version__
from sidecar.contracts.codec import encode, request_id_hint
from sidecar.contracts.events import (
    DLQ_HEADER_PREFIX,
    AnswerVerdict,
    ClaimVerdict,
    CoverageReport,
    DeadLetterRecord,
    Decision,
    Reason,
    dlq_header,
)
from sidecar.exceptions import InputError, RecordTooLargeError
from sidecar.pipeline.join import InputRef, PendingRequest
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome

IDEMPOTENCY_HEADER = "x-idempotency-key"
# the policy names the risk profile that decided as a reason ``profile.<name>``
PROFILE_REASON_PREFIX = "profile."
MAX_DLQ_DETAIL_CHARS = 2_000
MAX_DLQ_KEY_BYTES = 1_024  # a truncated dead letter keeps at most this much of its key
MAX_DLQ_NOTE_BYTES = 256  # x-dlq-truncated-reason
MAX_DLQ_DROPPED_BYTES = 128  # x-dlq-dropped-headers (the names, comma-separated)
# Kafka's record batch v2 framing: a 61-byte batch header; per record at most 36 bytes of
# varints and attributes; per header at most 10 bytes of length varints (KIP-98 format).
BATCH_OVERHEAD_BYTES = 61
RECORD_OVERHEAD_BYTES = 36
HEADER_OVERHEAD_BYTES = 10

Header = tuple[str, bytes]


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
    """The idempotency key of a complete request's final verdict."""
    return idempotency_key(entry.request_id, entry.retrieval_digest, entry.final_digest)


def incomplete_key(entry: PendingRequest) -> str:
    return idempotency_key(
        entry.request_id, b"incomplete", entry.retrieval_digest, entry.final_digest
    )


def verdict_attributes(verdict: AnswerVerdict) -> dict[str, AttributeValue]:
    """The verdict's trace attributes (``guardrail.*``), which its metrics are counted from.

    ``guardrail.profile``: the risk profile that decided, taken from the policy's
    ``profile.<name>`` reason (``none``: no profile decided, e.g. an incomplete
    request); ``guardrail.reasons`` are the other reasons' codes.
    """
    codes = [r.code for r in verdict.reasons]
    profiles = [c.removeprefix(PROFILE_REASON_PREFIX) for c in codes if _is_profile(c)]
    return {
        "guardrail.request_id": verdict.request_id,
        "guardrail.tenant": verdict.tenant or "",
        "guardrail.decision": verdict.decision.value,
        "guardrail.stage": verdict.stage,
        "guardrail.profile": profiles[0] if profiles else "none",
        "guardrail.reasons": [c for c in codes if not _is_profile(c)],
        "guardrail.policy": verdict.policy,
        **{f"guardrail.model.{k}": v for k, v in verdict.model_versions.items()},
    }


def _is_profile(code: str) -> bool:
    return code.startswith(PROFILE_REASON_PREFIX)


def verdict_output(verdict: AnswerVerdict, entry: PendingRequest, end_ns: int) -> Step:
    """A final (or incomplete) verdict; publishing it finishes every input of the request."""
    trace = TraceRecord(
        name="guardrail.request",
        parent=entry.trace_parent(),
        start_ns=entry.first_seen_ns,
        end_ns=end_ns,
        attributes=verdict_attributes(verdict),
        stages=tuple(entry.stages),
    )
    out = Output(
        destination=Destination.VERDICTS,
        key=verdict.request_id.encode("utf-8"),
        value=encode(verdict),
        headers=utf8_headers({IDEMPOTENCY_HEADER: verdict.idempotency_key}),
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
        headers=utf8_headers({IDEMPOTENCY_HEADER: verdict.idempotency_key}),
        trace=TraceRecord(
            name="guardrail.stream_block",
            parent=entry.trace_parent(),
            start_ns=entry.first_seen_ns,
            end_ns=time.time_ns(),
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
    headers = [
        (name, value) for name, value in ref.headers if not name.startswith(DLQ_HEADER_PREFIX)
    ]
    headers.extend(record.to_headers())
    return Output(destination=Destination.DLQ, key=key, value=raw or b"", headers=headers)


def undeliverable_output(
    out: Output, topic: str, error: InputError, *, failed_at: datetime
) -> Output:
    """A dead letter for an output that its own topic refused for good (too large).

    ``source_topic`` is the topic the output was meant for; partition and offset
    are -1 (it never had any). The output's own headers travel along.
    """
    record = DeadLetterRecord(
        reason=error.reason,
        detail=error.detail[:MAX_DLQ_DETAIL_CHARS],
        source_topic=topic,
        source_partition=-1,
        source_offset=-1,
        request_id=out.key.decode("utf-8", errors="replace")[:256] if out.key else None,
        failed_at=failed_at,
        sidecar_version=__version__,
    )
    headers = [(k, v) for k, v in out.headers if not k.startswith(DLQ_HEADER_PREFIX)]
    headers.extend(record.to_headers())
    return Output(destination=Destination.DLQ, key=out.key, value=out.value, headers=headers)


def record_size(key: bytes | None, value: bytes, headers: Sequence[Header]) -> int:
    """An upper bound of the bytes a record takes in a record batch of its own.

    The broker compares a batch's size with the topic's ``max.message.bytes``; a
    record over the producer's batch size is always sent in a batch of its own.
    """
    return (
        BATCH_OVERHEAD_BYTES
        + RECORD_OVERHEAD_BYTES
        + len(key or b"")
        + len(value)
        + sum(HEADER_OVERHEAD_BYTES + len(k.encode("utf-8")) + len(v) for k, v in headers)
    )


def fit_dead_letter(out: Output, max_bytes: int, why: str) -> Output:
    """``out`` itself when it fits into ``max_bytes``, else a truncated copy that does.

    The truncated copy keeps its ``x-dlq-*`` headers (the detail cut if need be),
    the key (up to ``MAX_DLQ_KEY_BYTES``), the original headers that fit into half
    of what is left (whole, in order; the others are named in
    ``x-dlq-dropped-headers``) and the first bytes of the value; it adds
    ``x-dlq-truncated: true``, ``x-dlq-original-size``, ``x-dlq-original-sha256``
    and ``x-dlq-truncated-reason`` (``why``). Raises ``RecordTooLargeError`` when not
    even the ``x-dlq-*`` headers fit (a DLQ limit far below any sane setting).
    """
    if record_size(out.key, out.value, out.headers) <= max_bytes:
        return out
    key = out.key[:MAX_DLQ_KEY_BYTES] if out.key is not None else None
    own = [(k, v) for k, v in out.headers if k.startswith(DLQ_HEADER_PREFIX)]
    original = [(k, v) for k, v in out.headers if not k.startswith(DLQ_HEADER_PREFIX)]
    marks = [
        (dlq_header("truncated"), b"true"),
        (dlq_header("original_size"), str(len(out.value)).encode("ascii")),
        (dlq_header("original_sha256"), hashlib.sha256(out.value).hexdigest().encode("ascii")),
        (dlq_header("truncated_reason"), _note(why, MAX_DLQ_NOTE_BYTES)),
    ]
    dropped_name = dlq_header("dropped_headers")
    reserve = HEADER_OVERHEAD_BYTES + len(dropped_name) + MAX_DLQ_DROPPED_BYTES
    own = _fit_detail(own, max_bytes - reserve - record_size(key, b"", marks), out)
    fixed = record_size(key, b"", own + marks) + reserve
    header_budget = (max_bytes - fixed) // 2
    kept: list[Header] = []
    dropped: list[str] = []
    for name, value in original:
        cost = HEADER_OVERHEAD_BYTES + len(name.encode("utf-8")) + len(value)
        if cost <= header_budget:
            kept.append((name, value))
            header_budget -= cost
        else:
            dropped.append(name)
    if dropped:
        marks.append((dropped_name, _note(",".join(dropped), MAX_DLQ_DROPPED_BYTES)))
    headers = kept + own + marks
    room = max_bytes - record_size(key, b"", headers)
    return Output(
        destination=out.destination,
        key=key,
        value=out.value[: max(0, room)],
        headers=headers,
        trace=out.trace,
    )


def _note(text: str, limit: int) -> bytes:
    """``text`` as UTF-8, at most ``limit`` bytes, never ending in half a character."""
    return text.encode("utf-8")[:limit].decode("utf-8", errors="ignore").encode("utf-8")


def _fit_detail(own: list[Header], budget: int, out: Output) -> list[Header]:
    """The ``x-dlq-*`` headers within ``budget`` bytes, cutting ``x-dlq-detail`` if need be."""
    size = sum(HEADER_OVERHEAD_BYTES + len(k.encode("utf-8")) + len(v) for k, v in own)
    if size <= budget:
        return own
    detail = dlq_header("detail")
    excess = size - budget
    cut = [(k, v[: max(0, len(v) - excess)] if k == detail else v) for k, v in own]
    if sum(HEADER_OVERHEAD_BYTES + len(k.encode("utf-8")) + len(v) for k, v in cut) > budget:
        raise RecordTooLargeError(
            str(out.destination),
            f"not even the dead letter's own x-dlq-* headers fit into {budget} bytes",
        )
    return cut
