"""Event contracts: what the LLM service writes and what the sidecar publishes.

Every event carries an explicit ``schema_version`` and an ``event_type``. The
models are the source of truth: the JSON Schemas and the AsyncAPI document in
``schemas/`` are generated from them (``guardrail schemas export``) and a test
fails when they drift.

Input events (produced by the LLM service, keyed by ``request_id``):
  * ``RetrievalEvent``   on ``rag.retrieval``  - what was retrieved, with raw scores;
  * ``GenerationDelta``  on ``rag.generation`` - one streamed piece of the answer;
  * ``GenerationFinal``  on ``rag.generation`` - the whole answer, the generator id
    and an optional attention summary (L x H x K lookback ratios, float16, base64).
Output events (produced by the sidecar, keyed by ``request_id``):
  * ``ClaimVerdict``     on ``rag.claims``;
  * ``AnswerVerdict``    on ``rag.verdicts``;
  * ``DeadLetterRecord`` describes the headers of a ``rag.dlq`` message (its value
    is the original bytes, untouched).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

SCHEMA_VERSION = 1
"""The version this build writes. Readers accept ``SUPPORTED_SCHEMA_VERSIONS``."""
SUPPORTED_SCHEMA_VERSIONS: frozenset[int] = frozenset({1})

RequestId = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=128,
        # at least one letter or digit: "." and ".." are path tricks, not request ids
        pattern=r"^[A-Za-z0-9._:\-]*[A-Za-z0-9][A-Za-z0-9._:\-]*$",
    ),
]
Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = 1


# --------------------------------------------------------------------------- input events


class RetrievalHit(BaseModel):
    """One retrieved chunk, in retrieval order (best first)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    chunk_id: Name
    doc_id: Name
    score: FiniteFloat = Field(description="Raw vector-store score (e.g. Qdrant cosine).")
    text: Annotated[str, StringConstraints(max_length=100_000)]


class RetrievalEvent(_Event):
    """What the LLM service retrieved for one request."""

    event_type: Literal["retrieval"] = "retrieval"
    request_id: RequestId
    tenant: Name
    collection: Name
    retriever: Name = Field(
        default="default", description="Retriever id (embedding model + index), calibration key."
    )
    query: Annotated[str, StringConstraints(max_length=20_000)]
    k: int = Field(ge=1, le=1024, description="K: how many chunks were asked for.")
    hits: list[RetrievalHit] = Field(max_length=1024)
    created_at: datetime | None = None

    @model_validator(mode="after")
    def _hits_within_k(self) -> Self:
        if len(self.hits) > self.k:
            raise ValueError(f"hits has {len(self.hits)} entries, more than k={self.k}")
        return self


class GenerationDelta(_Event):
    """One streamed piece of the answer; ``seq`` counts from 0 without gaps."""

    event_type: Literal["generation.delta"] = "generation.delta"
    request_id: RequestId
    seq: int = Field(ge=0, le=1_000_000)
    text: Annotated[str, StringConstraints(max_length=100_000)]


class AttentionSummary(BaseModel):
    """The generator's chunk-wise lookback ratios: L layers x H heads x K chunks.

    ``values`` is base64 of little-endian float16 in C order (layer, head, chunk).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: int = Field(ge=1, le=1024)
    heads: int = Field(ge=1, le=1024)
    chunks: int = Field(ge=1, le=1024)
    variant: Literal["cw", "fc"] = Field(
        default="cw", description="cw: chunk-wise lookback ratios; fc: full-context."
    )
    dtype: Literal["float16"] = "float16"
    values: str = Field(description="base64 of L*H*K little-endian float16 values")

    @model_validator(mode="after")
    def _shape_matches(self) -> Self:
        expected = self.layers * self.heads * self.chunks * 2
        try:
            raw = base64.b64decode(self.values, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"values is not valid base64: {exc}") from None
        if len(raw) != expected:
            raise ValueError(
                f"values holds {len(raw)} bytes, shape {self.layers}x{self.heads}x{self.chunks} "
                f"float16 needs {expected}"
            )
        if not np.isfinite(np.frombuffer(raw, dtype="<f2")).all():
            raise ValueError("values contains NaN or Inf")
        return self

    def to_array(self) -> npt.NDArray[np.float32]:
        """The summary as a float32 array of shape (L, H, K)."""
        raw = base64.b64decode(self.values)
        arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        return arr.reshape(self.layers, self.heads, self.chunks)

    @classmethod
    def from_array(cls, array: npt.ArrayLike, variant: Literal["cw", "fc"] = "cw") -> Self:
        arr = np.asarray(array, dtype="<f2")
        if arr.ndim != 3:
            raise ValueError(f"attention summary must be 3-d (L, H, K), got shape {arr.shape}")
        layers, heads, chunks = (int(d) for d in arr.shape)
        values = base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")
        return cls(layers=layers, heads=heads, chunks=chunks, variant=variant, values=values)


class GenerationFinal(_Event):
    """The end of a generation: the whole answer and what the generator knows about it."""

    event_type: Literal["generation.final"] = "generation.final"
    request_id: RequestId
    answer: Annotated[str, StringConstraints(max_length=200_000)]
    generator_model: Name
    deltas: int | None = Field(
        default=None, ge=0, description="How many deltas were sent before this event."
    )
    attention: AttentionSummary | None = None
    mean_token_logprob: FiniteFloat | None = Field(default=None, le=0.0)


class FeedbackEvent(_Event):
    """A labelled outcome for an answered request (``rag.feedback``, keyed by request_id).

    Whoever learns whether an answer was right (a user's thumbs, a reviewer, an
    offline grader) publishes it; the sidecar folds it into the fleet coverage
    bound, and ``guardrail train confidence --from-kafka`` refits the calibrated
    confidence on verdicts joined with feedback.
    """

    event_type: Literal["feedback"] = "feedback"
    request_id: RequestId
    correct: bool = Field(description="was the answer correct?")
    abstained: bool = Field(
        default=False, description="the generator declined to answer (not a hallucination)"
    )
    source: Name = Field(description="who labelled it: user, reviewer, grader, ...")
    created_at: datetime | None = None


InputEvent = RetrievalEvent | GenerationDelta | GenerationFinal

# --------------------------------------------------------------------------- output events


class Decision(StrEnum):
    ALLOW = "allow"
    CAVEAT = "caveat"
    BLOCK = "block"


class ClaimLabel(StrEnum):
    SUPPORTED = "supported"
    UNSUPPORTED = "unsupported"
    UNCERTAIN = "uncertain"
    IRRELEVANT = "irrelevant"


class SignalStatus(StrEnum):
    OK = "ok"
    UNAVAILABLE = "unavailable"  # configured, but this request could not be scored
    NOT_CONFIGURED = "not-configured"  # no model or calibration loaded for it


class Reason(BaseModel):
    """A machine-readable reason (``code``) with a human-readable message."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64)]
    message: str
    signal: Literal["retrieval", "lookback", "claims", "confidence", "policy", "pipeline"] = (
        "policy"
    )


class RetrievalSignal(BaseModel):
    """Conformal certification of the retrieved chunks (seed 000 section 3.2)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    status: SignalStatus
    trusted_chunk_ids: list[str] = Field(default_factory=list)
    m1: bool | None = Field(
        default=None,
        description="any trusted chunk: at least one retrieved chunk is in the trusted set C "
        "(m1 in docs/methods.md)",
    )
    m2: Probability | None = Field(
        default=None,
        description="trusted fraction: |C| / K, the share of the K requested chunks that are "
        "trusted (m2 in docs/methods.md)",
    )
    q_hat: float | None = Field(default=None, description="None when nothing is certifiable")
    alpha: Probability | None = None
    certifiable: bool | None = Field(
        default=None, description="false when k > n: no threshold exists at this alpha"
    )
    calibration_version: str | None = None
    calibration_key: str | None = None
    fallback: bool = False
    fallback_reason: str | None = None
    clipped_scores: int = 0
    monitor: Literal["warming-up", "ok", "exchangeability-broken"] | None = Field(
        default=None, description="rolling mean(m1) vs 1 - alpha (Wilson interval)"
    )
    m1_mean: Probability | None = None


class LookbackSignal(BaseModel):
    """Lookback-ratio factuality (seed 000 section 3.3)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    status: SignalStatus
    p_factual: Probability | None = None
    model_version: str | None = None


class ClaimsSignal(BaseModel):
    """Claim verification summary (seeds 001, 002)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    status: SignalStatus
    n: int = 0
    supported: int = 0
    unsupported: int = 0
    uncertain: int = 0
    irrelevant: int = 0
    reliability: Probability | None = None
    reliability_level: Literal["HIGH", "MEDIUM", "LOW"] | None = None
    hallucination_rate: Probability | None = None
    evidence_scope: Literal["trusted", "all-retrieved"] | None = None
    stream_mismatch: bool = Field(
        default=False,
        description="The final answer is not the streamed deltas' text: the final answer was "
        "verified (policy reason stream-final-mismatch).",
    )
    superseded_claims: list[int] = Field(
        default_factory=list,
        description="claim_index of ClaimVerdicts published from the stream whose sentence the "
        "final answer no longer holds; they are not counted in n or the scores.",
    )
    unchecked: int = Field(
        default=0,
        ge=0,
        description="Claims past the per-answer limit: counted, not verified, not in n "
        "(policy reason claims-over-limit).",
    )


class Signals(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    retrieval: RetrievalSignal = RetrievalSignal(status=SignalStatus.NOT_CONFIGURED)
    lookback: LookbackSignal = LookbackSignal(status=SignalStatus.NOT_CONFIGURED)
    claims: ClaimsSignal = ClaimsSignal(status=SignalStatus.NOT_CONFIGURED)


class ChunkForecast(BaseModel):
    """A trusted chunk ranked by the forecast that it helps a correct answer (seed 004)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    chunk_id: str
    p_useful: Probability
    retrieval_rank: int = Field(ge=0, description="0-based position in the retrieval order")


class RetrieveAgain(BaseModel):
    """Advice to the LLM service: retrieve once more with a reformulated query (seed 004).

    The sidecar only advises, once per request; reformulating and retrieving
    (Stage 3) is the LLM service's job.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    action: Literal["retrieve_again"] = "retrieve_again"
    best_forecast: Probability
    tau: Probability
    hint: str
    missing_terms: list[str] = Field(default_factory=list)


class ClaimVerdict(_Event):
    """One claim of a streaming answer, verified as soon as its sentence completed."""

    event_type: Literal["claim.verdict"] = "claim.verdict"
    request_id: RequestId
    idempotency_key: str
    claim_index: int = Field(ge=0)
    span: tuple[int, int] = Field(description="[start, end) character offsets into the answer")
    text: str
    label: ClaimLabel
    score: Probability
    evidence_chunk_ids: list[str] = Field(default_factory=list)
    verifier_version: str
    produced_at: datetime


class AnswerVerdict(_Event):
    """The decision for one answer: allow, caveat or block, with its reasons."""

    event_type: Literal["answer.verdict"] = "answer.verdict"
    request_id: RequestId
    idempotency_key: str = Field(
        description="Same inputs give the same key: a replay after a crash is recognisable."
    )
    tenant: str | None = None
    decision: Decision
    reasons: list[Reason]
    stage: Literal["stream", "final"] = Field(
        default="final",
        description="stream: strict mode blocked mid-answer; the final verdict still follows",
    )
    escalate: bool = Field(default=False, description="a human should look (seed 001)")
    policy: str = Field(description="Name and version of the policy that decided.")
    signals: Signals = Signals()
    confidence: Probability | None = Field(
        default=None,
        description="calibrated probability that the answer is correct (seed 004); "
        "null when no confidence model is configured, the request was incomplete, or on "
        "a strict-mode stream verdict (the answer is not finished)",
    )
    confidence_features: dict[str, float | None] = Field(
        default_factory=dict,
        description="the signal values the confidence was computed from (null: missing)",
    )
    chunk_forecast: list[ChunkForecast] = Field(
        default_factory=list, description="trusted chunks, most useful first"
    )
    advice: RetrieveAgain | None = None
    certified_risk: Probability | None = Field(
        default=None,
        description="certified allow: the decision was taken under an allow certificate "
        "('guardrail calibrate policy'), which promises that among the answers its profile "
        "allows for this calibration key at most this share are wrong, with probability >= "
        "1 - certified_delta over the calibration draw. A promise about the population of "
        "allowed answers, not about this answer; null when no certificate was in force",
    )
    certified_delta: Probability | None = Field(
        default=None,
        description="the certificate's delta: the probability that its calibration draw was "
        "unlucky and the risk bound does not hold",
    )
    certificate: str | None = Field(
        default=None,
        description="calibration key (tenant/collection/retriever) of the certificate in force",
    )
    caveat_text: str | None = None
    rewritten_answer: str | None = None
    model_versions: dict[str, str] = Field(default_factory=dict)
    timings_ms: dict[str, FiniteFloat] = Field(default_factory=dict)
    produced_at: datetime
    sidecar_version: str


class BoundEstimate(BaseModel):
    """A proportion with its Wilson interval; ``None`` when nothing was observed."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    value: Probability | None
    low: Probability | None
    high: Probability | None
    successes: int = Field(ge=0)
    trials: int = Field(ge=0)


class CertificateStatus(BaseModel):
    """The allow certificate of a calibration key, re-tested on feedback labels.

    The labels of answers allowed under the certificate in the sliding window:
    the error among them with its Clopper-Pearson interval. ``violated``: even
    the low end is above the certified risk (policy reason
    ``certificate-violated``, allow withdrawn); ``holds``: not violated
    (``error_high <= risk`` also confirms it); ``insufficient-data``: no labels.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    risk: Probability
    delta: Probability
    labelled: int = Field(ge=0)
    errors: int = Field(ge=0)
    error_rate: Probability | None
    error_low: Probability | None
    error_high: Probability | None
    status: Literal["holds", "violated", "insufficient-data"]


class CoverageReport(_Event):
    """Fleet-level coverage bound for one calibration key (seed 003), published periodically.

    H <= c * epsilon + (1 - c) * delta, with Wilson intervals propagated to the
    bound's ends, compared with the hallucination rate measured from feedback.
    """

    event_type: Literal["coverage.report"] = "coverage.report"
    calibration_key: str
    window_requests: int = Field(ge=0)
    coverage: BoundEstimate
    epsilon: BoundEstimate
    delta: BoundEstimate
    delta_source: Literal["probe", "labelled-uncovered", "none"]
    bound: Probability | None
    bound_low: Probability | None
    bound_high: Probability | None
    measured_hallucination: BoundEstimate
    status: Literal["holds", "violated", "insufficient-data"]
    confidence_level: Probability
    certificate: CertificateStatus | None = Field(
        default=None, description="the key's allow certificate re-tested on feedback, if any"
    )
    produced_at: datetime
    sidecar_version: str


OutputEvent = ClaimVerdict | AnswerVerdict | CoverageReport

# --------------------------------------------------------------------------- dead letters

DLQ_HEADER_PREFIX = "x-dlq-"


class DeadLetterRecord(BaseModel):
    """What a ``rag.dlq`` message says about itself, in its headers.

    The message value is the original bytes, untouched; the original key and
    headers are kept, their values as the original bytes. These fields travel
    as ``x-dlq-<field>`` headers (UTF-8).

    A dead letter that cannot fit into the DLQ topic whole is cut down to fit:
    ``truncated`` is then true, the value is the first bytes of the original,
    ``original_size`` / ``original_sha256`` describe the original value,
    ``truncated_reason`` says which limit was hit and ``dropped_headers`` names
    the original headers left out.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64)]
    detail: Annotated[str, StringConstraints(max_length=2_000)]
    source_topic: str
    source_partition: int
    source_offset: int
    request_id: str | None = None
    failed_at: datetime
    sidecar_version: str
    truncated: bool | None = None
    original_size: int | None = None
    original_sha256: str | None = None
    truncated_reason: str | None = None
    dropped_headers: str | None = None

    def to_headers(self) -> list[tuple[str, bytes]]:
        dumped = self.model_dump(mode="json", exclude_none=True)
        return [(dlq_header(k), _header_text(v).encode("utf-8")) for k, v in dumped.items()]

    @classmethod
    def from_headers(
        cls, headers: Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]]
    ) -> Self:
        """Read the ``x-dlq-*`` headers back (values as bytes, as Kafka hands them, or text)."""
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        fields = {
            k[len(DLQ_HEADER_PREFIX) :].replace("-", "_"): (
                v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
            )
            for k, v in pairs
            if k.startswith(DLQ_HEADER_PREFIX)
        }
        return cls.model_validate(fields)


def dlq_header(field_name: str) -> str:
    """``source_topic`` -> ``x-dlq-source-topic``."""
    return f"{DLQ_HEADER_PREFIX}{field_name.replace('_', '-')}"


def _header_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
