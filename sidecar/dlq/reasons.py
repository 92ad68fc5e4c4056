"""Which dead-letter reasons a second, unchanged send can get past.

A redrive sends the original bytes, key and headers again. That helps only when what
refused them was on the sidecar's side (a limit, a calibration, a setting, a bug) and
has changed since; when the bytes themselves are wrong, the same bytes are refused
again, so ``guardrail dlq redrive`` refuses those reasons unless ``--force``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["NOT_REDRIVABLE", "REDRIVABLE", "is_known", "known_reasons"]

REDRIVABLE: Final[dict[str, str]] = {
    "oversize": "GUARDRAIL_LIMITS__MAX_MESSAGE_BYTES is raised",
    "too-deep": "GUARDRAIL_LIMITS__MAX_JSON_DEPTH is raised",
    "unknown-schema-version": "the sidecar reads that schema_version (an upgrade)",
    "untrusted-tenant": "the tenancy settings (GUARDRAIL_TENANCY__*) are fixed",
    "tenant-mismatch": "the tenancy settings (GUARDRAIL_TENANCY__*) are fixed",
    "too-many-hits": "GUARDRAIL_LIMITS__MAX_HITS is raised",
    "answer-too-long": "GUARDRAIL_LIMITS__MAX_ANSWER_CHARS is raised",
    "request-too-large": "GUARDRAIL_LIMITS__MAX_REQUEST_BYTES (or GUARDRAIL_JOIN__MAX_BYTES) "
    "is raised",
    "unknown-collection": "the collection is calibrated (or "
    "GUARDRAIL_SIGNALS__UNKNOWN_COLLECTION is no longer reject)",
    "generator-mismatch": "a lookback model for that generator is served (or "
    "GUARDRAIL_SIGNALS__LOOKBACK_MISMATCH is no longer dead-letter)",
    "attention-shape": "a lookback model for that summary is served (or "
    "GUARDRAIL_SIGNALS__LOOKBACK_MISMATCH is no longer dead-letter)",
    "internal-error": "the sidecar's bug is fixed",
    "reroute-refused": "the redrive's own producer may write the input topic (it sends the "
    "record keyed, to its request's partition)",
}
"""Reasons a changed sidecar may accept the same bytes for: what must change first."""

NOT_REDRIVABLE: Final[dict[str, str]] = {
    "malformed-json": "the bytes are not JSON",
    "invalid-utf8": "the bytes are not UTF-8",
    "not-an-object": "the JSON is not an object",
    "missing-schema-version": "the event has no schema_version",
    "wrong-event-type": "the event type does not belong on its topic",
    "schema-violation": "the event breaks its schema",
    "key-mismatch": "the original key, kept, is still not the request_id",
    "too-many-deltas": "the limit of 100,000 deltas a request is fixed",
    "duplicate-conflict": "its request holds (or was decided on) the other copy",
    "after-final": "its request was decided: it is after-final again, or, once forgotten, "
    "opens the request for a second verdict",
    "invalid-score": "the score is no finite number",
    "score-out-of-range": "the retriever's scores are outside the calibrated range",
    "invalid-depth": "k is below the number of hits",
    "batch-too-large": "the dead letter stands for records it does not hold",
    "corrupt-batch": "the dead letter stands for records it does not hold",
    "unsupported-codec": "the dead letter stands for records it does not hold",
    "too-many-headers": "the record's headers were not read",
    "unreadable-batch": "the record carries the sidecar's own x-guardrail-unread header",
    "output-too-large": "not an input: an output its own topic refused",
}
"""Reasons the same bytes are refused for again: why."""


def known_reasons() -> list[str]:
    return sorted({*REDRIVABLE, *NOT_REDRIVABLE})


def is_known(reason: str) -> bool:
    return reason in REDRIVABLE or reason in NOT_REDRIVABLE
