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
    message: str = Field(
        description="Human-readable detail (numbers, names, thresholds): for people and logs; "
        "its wording may change, so never match on it."
    )
    signal: Literal["retrieval", "lookback", "claims", "confidence", "policy", "pipeline"] = Field(
        default="policy",
        description="What produced the reason: a signal (retrieval, lookback, claims, "
        "confidence), the policy itself, or the pipeline (incomplete, internal-error).",
    )


SCORES_RISING: Final = "scores-rise-down-the-list"
"""``RetrievalSignal.fallback_reason`` of a retriever whose scores rise down its hit lists
(distances, read the wrong way round by the calibration): nothing of it is certified."""


class RetrievalSignal(BaseModel):
    """Certification of the retrieved chunks (docs/methods.md §Retrieval certification)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    status: SignalStatus = Field(
        description="ok: certified (the fields below are set); not-configured: no retrieval "
        "calibration is served; unavailable: configured, but this request could not be "
        "certified. Only status and the defaults are set when it is not ok."
    )
    trusted_chunk_ids: list[str] = Field(
        default_factory=list,
        description="chunk_id of each retrieved chunk in the trusted set C, in retrieval "
        "order; empty when none passed the threshold, the calibration is not certifiable at "
        "this alpha, or the scores rise down the list (fallback_reason "
        "scores-rise-down-the-list)",
    )
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
    alpha: Probability | None = Field(
        default=None,
        description="the calibration's miscoverage level alpha (0..1): under "
        "exchangeability a correct chunk is trusted with probability >= 1 - alpha; null when "
        "status is not ok",
    )
    certifiable: bool | None = Field(
        default=None, description="false when k > n: no threshold exists at this alpha"
    )
    calibration_version: str | None = Field(
        default=None,
        description="id of the served calibration artifact, "
        "'<retriever>@<collection>:<first 12 hex digits of its data hash>'; null when status "
        "is not ok",
    )
    calibration_key: str | None = Field(
        default=None,
        description="the calibration that certified this retrieval: 'tenant/collection/"
        "retriever' of its own key, or 'global' when the global calibration stood in "
        "(fallback); null when status is not ok",
    )
    fallback: bool = Field(
        default=False,
        description="true when the request's own key was not used: the global calibration "
        "stood in, or nothing was certified because the scores rise down the list; "
        "fallback_reason says which (policy reason retrieval-calibration-fallback)",
    )
    fallback_reason: str | None = Field(
        default=None,
        description="why fallback is true, one of (more may be added in schema_version 1): "
        "too-few-samples (the key's correct chunks are too few for alpha), degenerate-scores "
        "(the key's calibration scores are all equal), unknown-key (the collection is "
        "calibrated, not this tenant/retriever), unknown-collection (the collection is not "
        f"calibrated), {SCORES_RISING} (distances, not similarities: nothing certified); "
        "null when fallback is false",
    )
    clipped_scores: int = Field(
        default=0,
        description="how many of this retrieval's raw scores fell outside the calibration's "
        "score range and were clipped to it (0 when status is not ok)",
    )
    monitor: Literal["warming-up", "ok", "exchangeability-broken"] | None = Field(
        default=None, description="rolling mean(m1) vs 1 - alpha (Wilson interval)"
    )
    m1_mean: Probability | None = Field(
        default=None,
        description="the rolling share (0..1) of this calibration key's recent certified "
        "retrievals that had a trusted chunk (mean of m1), which monitor compares with "
        "1 - alpha; null until the key has a window under this calibration, and when nothing "
        "was certified",
    )


class LookbackSignal(BaseModel):
    """Lookback-ratio factuality (docs/methods.md §Lookback-ratio factuality)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    status: SignalStatus = Field(
        description="ok: scored; not-configured: no lookback model is served; unavailable: "
        "served, but this answer could not be scored (no attention summary, one the model "
        "cannot read, or a scoring error)"
    )
    p_factual: Probability | None = Field(
        default=None,
        description="the lookback model's probability (0..1) that the answer is factual, "
        "from the lookback ratios of its attention summary; null unless status is ok",
    )
    model_version: str | None = Field(
        default=None,
        description="the lookback model that scored it (or failed to), 'name@<onnx sha256 "
        "prefix>'; null when no model is served",
    )


class ClaimsSignal(BaseModel):
    """Claim verification summary (docs/methods.md §Claim verification)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    status: SignalStatus = Field(
        description="ok: the answer's claims were verified (counts and scores set); "
        "not-configured: claim verification is off; unavailable: on, but this answer's "
        "claims could not be verified"
    )
    n: int = Field(
        default=0,
        description="claims verified in the final answer (supported + unsupported + "
        "uncertain + irrelevant); not counting unchecked, unreadable or superseded ones",
    )
    supported: int = Field(
        default=0,
        description="claims whose p(supported) reached the verifier's supported cut-off (or "
        "that the LLM judge verified)",
    )
    unsupported: int = Field(
        default=0,
        description="claims below the verifier's unsupported cut-off, with a number, date or "
        "quantity the evidence does not hold, without any evidence, or that the LLM judge "
        "found unsupported",
    )
    uncertain: int = Field(
        default=0,
        description="claims whose p(supported) falls between the verifier's unsupported and "
        "supported cut-offs (or that the LLM judge found partly verified)",
    )
    irrelevant: int = Field(
        default=0,
        description="claims that are not factual statements about the question (only the "
        "LLM judge gives this label); left out of reliability and hallucination_rate",
    )
    reliability: Probability | None = Field(
        default=None,
        description="(supported + 0.5 * uncertain) / (n - irrelevant), 0..1; 1.0 when no "
        "claim counts; null unless status is ok",
    )
    reliability_level: Literal["HIGH", "MEDIUM", "LOW"] | None = Field(
        default=None,
        description="the reliability tier: HIGH when reliability >= 0.85, MEDIUM when >= "
        "0.65, else LOW (the profile's claims.reliability_actions maps it to an action); "
        "null unless status is ok",
    )
    hallucination_rate: Probability | None = Field(
        default=None,
        description="unsupported / (n - irrelevant), 0..1; 0.0 when no claim counts; null "
        "unless status is ok",
    )
    evidence_scope: Literal["trusted", "all-retrieved"] | None = Field(
        default=None,
        description="which chunks the claims were checked against: trusted (the certified "
        "chunks) or all-retrieved (no chunk was trusted; policy reason "
        "claims-evidence-untrusted); null unless status is ok",
    )
    stream_mismatch: bool = Field(
        default=False,
        description="The final answer is not the streamed deltas' text (in another Unicode "
        "normal form, NFC or NFD, it is the same text; a compatibility form or an invisible "
        "character differs): the final answer was verified (policy reason "
        "stream-final-mismatch).",
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
    unjudged: int = Field(
        default=0,
        ge=0,
        description="Claims of the final answer the LLM judge was due to label and did not: "
        "its breaker open, its pool saturated, the call failed or came too late (they keep "
        "the verifier's label; claims past its per-answer call budget are not counted). An "
        "allow certificate fitted with the judge does not apply to such an answer (reason "
        "certificate-not-applicable). 0 without a judge.",
    )


class Signals(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    retrieval: RetrievalSignal = Field(
        default=RetrievalSignal(status=SignalStatus.NOT_CONFIGURED),
        description="retrieval certification: which chunks are trusted",
    )
    lookback: LookbackSignal = Field(
        default=LookbackSignal(status=SignalStatus.NOT_CONFIGURED),
        description="lookback-ratio factuality of the answer",
    )
    claims: ClaimsSignal = Field(
        default=ClaimsSignal(status=SignalStatus.NOT_CONFIGURED),
        description="claim verification summary of the final answer",
    )


class ChunkForecast(BaseModel):
    """A trusted chunk ranked by the forecast that it helps a correct answer.

    Stage 2 of docs/methods.md §Calibrated confidence.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    chunk_id: str = Field(description="the chunk's chunk_id in the retrieval event")
    p_useful: Probability = Field(
        description="the chunk model's forecast (0..1) that this chunk helps a correct answer"
    )
    retrieval_rank: int = Field(ge=0, description="0-based position in the retrieval order")


class RetrieveAgain(BaseModel):
    """Advice to the LLM service: retrieve once more with a reformulated query.

    The sidecar only advises, once per request; reformulating and retrieving
    (Stage 3 of docs/methods.md §Calibrated confidence) is the LLM service's job.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    action: Literal["retrieve_again"] = Field(
        default="retrieve_again", description="what is advised: always retrieve_again"
    )
    best_forecast: Probability = Field(
        description="the highest p_useful of chunk_forecast (0..1); 0 when no chunk was "
        "forecast (none trusted)"
    )
    tau: Probability = Field(
        description="the confidence model's retrieve-again threshold (0..1): advice is given "
        "when best_forecast is below it"
    )
    hint: str = Field(
        description="one English sentence for the LLM service: why, and how to reformulate "
        "the query (keep missing_terms, or name the entity, place or time period)"
    )
    missing_terms: list[str] = Field(
        default_factory=list,
        description="up to 5 content words of the query (lower-cased, accents folded, "
        "longer than 2 characters, no stop words) that no retrieved chunk contains",
    )


class ClaimVerdict(EventBase):
    """One claim of a streaming answer, verified as soon as its sentence completed."""

    event_type: Literal["claim.verdict"] = Field(
        default="claim.verdict", description="always claim.verdict"
    )
    request_id: RequestId = Field(description="the request the claim belongs to (the key)")
    idempotency_key: str = Field(
        description="32 hex digits, the same for the same request, tenant, retrieval, claim "
        "index and text: a re-published claim verdict (replay, restart) carries the same key"
    )
    tenant: str | None = Field(
        default=None,
        description="the request's tenant, as on its answer verdict (a client that knows its "
        "tenant ignores claim verdicts another tenant provoked under the same request id)",
    )
    claim_index: int = Field(
        ge=0,
        description="the claim's number within the request, from 0 in stream order; a claim "
        "the final answer no longer holds keeps its number (signals.claims.superseded_claims)",
    )
    span: tuple[int, int] = Field(
        description="[start, end) character (code point) offsets into the answer: into the "
        "deltas' text joined for a claim verdict published while the answer streamed, into "
        "the final answer for one published with it (when the final is the deltas' text in "
        "another Unicode normal form, the streamed spans index the deltas' form)"
    )
    text: str = Field(
        description="the claim as verified: the span's words, with the subject copied in "
        "when a sentence's second verb phrase was split off ('Aspirin is effective for pain')"
    )
    label: ClaimLabel = Field(
        description="supported, unsupported, uncertain or irrelevant (irrelevant only from "
        "the LLM judge)"
    )
    score: Probability = Field(
        description="final p(supported), 0..1: the verifier's calibrated probability, capped "
        "when a number, date or quantity of the claim is not in the evidence, or the LLM "
        "judge's label mapped to 0.9 / 0.5 / 0.1"
    )
    evidence_chunk_ids: list[str] = Field(
        default_factory=list,
        description="chunk_id of the chunks whose sentences the claim was checked against; "
        "empty when there was no evidence",
    )
    verifier_version: str = Field(
        description="the claim checker: the verifier's version, then '+rules' when the "
        "number/date rule tier is on and '+judge' when an LLM judge is"
    )
    produced_at: datetime = Field(description="when the sidecar wrote it (UTC)")


class AnswerVerdict(EventBase):
    """The decision for one answer: allow, caveat or block, with its reasons."""

    event_type: Literal["answer.verdict"] = Field(
        default="answer.verdict", description="always answer.verdict"
    )
    request_id: RequestId = Field(description="the request decided (also the record's key)")
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
    signals: Signals = Field(
        default=Signals(),
        description="what each signal found; all not-configured on an incomplete, "
        "internal-error or stage=stream verdict",
    )
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
    advice: RetrieveAgain | None = Field(
        default=None,
        description="advice to retrieve again, when a confidence model is served, the "
        "retrieval had hits and no forecast chunk reached its tau; null otherwise",
    )
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
    model_versions: dict[str, str] = Field(
        default_factory=dict,
        description="what decided, by part: generator (the generation event's "
        "generator_model), certifier (calibration artifact id), lookback, verifier, "
        "confidence (each only when served) and policy ('name/version@<12 hex digits>' of "
        "its rules and certificates); empty on incomplete, internal-error and stage=stream "
        "verdicts",
    )
    timings_ms: dict[str, FiniteFloat] = Field(
        default_factory=dict,
        description="milliseconds: join_wait (from the request's first event to its "
        "decision, on the join's clock), signals (scoring the whole batch of requests decided "
        "with it) and policy (this decision); empty on incomplete, internal-error and "
        "stage=stream verdicts",
    )
    produced_at: datetime = Field(description="when the sidecar wrote it (UTC)")
    sidecar_version: str = Field(description="version of the sidecar that wrote it")
