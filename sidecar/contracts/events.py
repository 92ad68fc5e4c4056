"""Event contracts: every event the sidecar reads or publishes, importable from one place.

Every event carries an explicit ``schema_version`` and an ``event_type``. The
models are the source of truth: the JSON Schemas and the AsyncAPI document in
``schemas/`` are generated from them (``guardrail schemas export``) and a test
fails when they drift. They live in one module per side of the wire:

  * :mod:`~sidecar.contracts.common`     - schema version, base event, constrained types;
  * :mod:`~sidecar.contracts.inputs`     - ``RetrievalEvent``, ``GenerationDelta``,
    ``GenerationFinal`` (written by the LLM service), ``FeedbackEvent``;
  * :mod:`~sidecar.contracts.verdicts`   - ``ClaimVerdict`` on ``rag.claims``,
    ``AnswerVerdict`` on ``rag.verdicts``, and the signals and reasons they carry;
  * :mod:`~sidecar.contracts.reports`    - ``CoverageReport`` on ``rag.reports``,
    ``CertificateWithdrawal`` on ``rag.certificates``;
  * :mod:`~sidecar.contracts.deadletter` - ``DeadLetterRecord``: the headers of a
    ``rag.dlq`` message (its value is the original bytes, untouched).
"""

from __future__ import annotations

from sidecar.contracts.common import (
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    EventBase,
    FiniteFloat,
    Name,
    Probability,
    RequestId,
)
from sidecar.contracts.deadletter import DLQ_HEADER_PREFIX, DeadLetterRecord, dlq_header
from sidecar.contracts.inputs import (
    FLOAT16_MAX,
    MAX_CHUNKS,
    AttentionSummary,
    FeedbackEvent,
    GenerationDelta,
    GenerationFinal,
    InputEvent,
    RetrievalEvent,
    RetrievalHit,
)
from sidecar.contracts.reports import (
    BoundEstimate,
    CertificateStatus,
    CertificateWithdrawal,
    CoverageReport,
)
from sidecar.contracts.verdicts import (
    AnswerVerdict,
    ChunkForecast,
    ClaimLabel,
    ClaimsSignal,
    ClaimVerdict,
    Decision,
    LookbackSignal,
    Reason,
    RetrievalSignal,
    RetrieveAgain,
    Signals,
    SignalStatus,
)

__all__ = [
    "DLQ_HEADER_PREFIX",
    "FLOAT16_MAX",
    "MAX_CHUNKS",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "AnswerVerdict",
    "AttentionSummary",
    "BoundEstimate",
    "CertificateStatus",
    "CertificateWithdrawal",
    "ChunkForecast",
    "ClaimLabel",
    "ClaimVerdict",
    "ClaimsSignal",
    "CoverageReport",
    "DeadLetterRecord",
    "Decision",
    "EventBase",
    "FeedbackEvent",
    "FiniteFloat",
    "GenerationDelta",
    "GenerationFinal",
    "InputEvent",
    "LookbackSignal",
    "Name",
    "OutputEvent",
    "Probability",
    "Reason",
    "RequestId",
    "RetrievalEvent",
    "RetrievalHit",
    "RetrievalSignal",
    "RetrieveAgain",
    "SignalStatus",
    "Signals",
    "dlq_header",
]

OutputEvent = ClaimVerdict | AnswerVerdict | CoverageReport | CertificateWithdrawal
