"""Verdicts the sidecar publishes, and the decision, reasons and signal summaries they carry.

``ClaimVerdict`` on ``rag.claims`` (one per claim, mid-stream) and
``AnswerVerdict`` on ``rag.verdicts`` (one per answer).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sidecar.contracts.common import EventBase, FiniteFloat, Probability, RequestId
from sidecar.contracts.reasons import reason_code_description


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

    code: Annotated[
        str,
        StringConstraints(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64),
        Field(description=reason_code_description()),
    ]
    message: str
    signal: Literal["retrieval", "lookback", "claims", "confidence", "policy", "pipeline"] = (
        "policy"
    )


SCORES_RISING: Final = "scores-rise-down-the-list"
"""``RetrievalSignal.fallback_reason`` of a retriever whose scores rise down its hit lists
(distances, read the wrong way round by the calibration): nothing of it is certified."""


class RetrievalSignal(BaseModel):
    """Certification of the retrieved chunks (docs/methods.md §Retrieval certification)."""

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
    """Lookback-ratio factuality (docs/methods.md §Lookback-ratio factuality)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    status: SignalStatus
    p_factual: Probability | None = None
    model_version: str | None = None


class ClaimsSignal(BaseModel):
    """Claim verification summary (docs/methods.md §Claim verification)."""

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
    unreadable: int = Field(
        default=0,
        ge=0,
        description="Sentences of the answer in a script the claim checker does not read "
        "(not Latin: Cyrillic, Greek, CJK ...), and lines of fenced code blocks: no claim was "
        "taken from them, none verified (policy reason claims-unreadable).",
    )


class Signals(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    retrieval: RetrievalSignal = RetrievalSignal(status=SignalStatus.NOT_CONFIGURED)
    lookback: LookbackSignal = LookbackSignal(status=SignalStatus.NOT_CONFIGURED)
    claims: ClaimsSignal = ClaimsSignal(status=SignalStatus.NOT_CONFIGURED)


class ChunkForecast(BaseModel):
    """A trusted chunk ranked by the forecast that it helps a correct answer.

    Stage 2 of docs/methods.md §Calibrated confidence.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    chunk_id: str
    p_useful: Probability
    retrieval_rank: int = Field(ge=0, description="0-based position in the retrieval order")


class RetrieveAgain(BaseModel):
    """Advice to the LLM service: retrieve once more with a reformulated query.

    The sidecar only advises, once per request; reformulating and retrieving
    (Stage 3 of docs/methods.md §Calibrated confidence) is the LLM service's job.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    action: Literal["retrieve_again"] = "retrieve_again"
    best_forecast: Probability
    tau: Probability
    hint: str
    missing_terms: list[str] = Field(default_factory=list)


class ClaimVerdict(EventBase):
    """One claim of a streaming answer, verified as soon as its sentence completed."""

    event_type: Literal["claim.verdict"] = "claim.verdict"
    request_id: RequestId
    idempotency_key: str
    tenant: str | None = Field(
        default=None,
        description="the request's tenant, as on its answer verdict (a client that knows its "
        "tenant ignores claim verdicts another tenant provoked under the same request id)",
    )
    claim_index: int = Field(ge=0)
    span: tuple[int, int] = Field(description="[start, end) character offsets into the answer")
    text: str
    label: ClaimLabel
    score: Probability
    evidence_chunk_ids: list[str] = Field(default_factory=list)
    verifier_version: str
    produced_at: datetime


class AnswerVerdict(EventBase):
    """The decision for one answer: allow, caveat or block, with its reasons."""

    event_type: Literal["answer.verdict"] = "answer.verdict"
    request_id: RequestId
    idempotency_key: str = Field(
        description="Same inputs give the same key: a replay after a crash is recognisable."
    )
    tenant: str | None = Field(
        default=None,
        description="the request's tenant: its retrieval event's (with header or fixed "
        "tenancy, the trusted tenant it was checked against); a request whose retrieval never "
        "came names the trusted tenant, or null when tenants come from the events",
    )
    decision: Decision = Field(
        description="allow: show the answer; caveat: show rewritten_answer when it is set "
        "(else the answer) followed by caveat_text; block: withhold the answer "
        "(rewritten_answer, when set, is the verified claims only or the refusal text)"
    )
    reasons: list[Reason] = Field(
        description="why, in order: on a decided answer profile.<name> first, then what each "
        "signal found (Reason.code lists the codes)"
    )
    stage: Literal["stream", "final"] = Field(
        default="final",
        description="stream: strict mode blocked mid-answer; the final verdict still follows",
    )
    escalate: bool = Field(
        default=False, description="a human should look (docs/methods.md §Claim verification)"
    )
    policy: str = Field(description="Name and version of the policy that decided.")
    signals: Signals = Signals()
    confidence: Probability | None = Field(
        default=None,
        description="calibrated probability that the answer is correct (docs/methods.md "
        "§Calibrated confidence); "
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
    caveat_text: str | None = Field(
        default=None,
        description="the note to show with the answer: set on every caveat, and on a block "
        "whose rewritten_answer holds verified claims; null otherwise",
    )
    rewritten_answer: str | None = Field(
        default=None,
        description="the text to show instead of the answer: on a caveat, the answer with its "
        "unsupported claims removed (caveat_text then says they were); on a block, the "
        "verified claims only, or the policy's refusal; null when the answer is shown as it is "
        "(allow, a caveat without known unsupported claims) or withheld without a text",
    )
    model_versions: dict[str, str] = Field(default_factory=dict)
    timings_ms: dict[str, FiniteFloat] = Field(default_factory=dict)
    produced_at: datetime
    sidecar_version: str
