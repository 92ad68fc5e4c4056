"""The coverage report published periodically on ``rag.reports``, one per calibration key,
and the fleet's certificate withdrawals on ``rag.certificates``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from sidecar.contracts.common import EventBase, Probability


class BoundEstimate(BaseModel):
    """A proportion with its Wilson interval; ``None`` when nothing was observed."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    value: Probability | None = Field(
        description="successes / trials (0..1); null when trials is 0"
    )
    low: Probability | None = Field(
        description="low end of the Wilson interval at confidence_level; null when trials is 0"
    )
    high: Probability | None = Field(
        description="high end of the Wilson interval at confidence_level; null when trials is 0"
    )
    successes: int = Field(
        ge=0,
        description="trials that counted: covered requests for coverage, wrong (not "
        "abstained) answers for the error rates",
    )
    trials: int = Field(ge=0, description="how many were observed (requests, or labelled answers)")


class CertificateStatus(BaseModel):
    """The allow certificate of a calibration key, re-tested on feedback labels.

    The labels of answers allowed under the certificate in the sliding window:
    the error among them with its Clopper-Pearson interval. ``violated``: even
    the low end is above the certified risk (policy reason
    ``certificate-violated``, allow withdrawn); ``holds``: not violated
    (``error_high <= risk`` also confirms it); ``insufficient-data``: no labels.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    risk: Probability = Field(
        description="the certified risk: at most this share of the allowed answers is wrong"
    )
    delta: Probability = Field(
        description="the certificate's delta: the probability that its risk bound does not hold"
    )
    labelled: int = Field(
        ge=0, description="labelled answers allowed under the certificate in the window"
    )
    errors: int = Field(ge=0, description="of them, labelled not correct")
    error_rate: Probability | None = Field(
        description="errors / labelled (0..1); null when labelled is 0"
    )
    error_low: Probability | None = Field(
        description="low end of the Clopper-Pearson interval of the error at the report's "
        "confidence_level; null when labelled is 0"
    )
    error_high: Probability | None = Field(
        description="high end of that interval; null when labelled is 0"
    )
    status: Literal["holds", "violated", "insufficient-data"] = Field(
        description="violated: error_low is above risk here, or the fleet withdrew the "
        "certificate (rag.certificates); holds: labels and not violated; insufficient-data: "
        "no labels and not withdrawn"
    )


class CoverageReport(EventBase):
    """Fleet-level coverage bound for one calibration key, published periodically.

    The bound of docs/methods.md §Coverage bound, H <= c * epsilon + (1 - c) *
    delta, with Wilson intervals propagated to the bound's ends, compared with
    the hallucination rate measured from feedback.
    """

    event_type: Literal["coverage.report"] = Field(
        default="coverage.report", description="always coverage.report"
    )
    calibration_key: str = Field(
        description="the window's key: a calibration key 'tenant/collection/retriever', "
        "'global[<tenant>]' for a tenant the global calibration stood in for, or "
        "'uncertified' for requests without a calibration key"
    )
    window_requests: int = Field(
        ge=0,
        description="requests of this key in this replica's window: its final verdicts "
        "whose retrieval was certified, at most the last GUARDRAIL_COVERAGE__WINDOW",
    )
    coverage: BoundEstimate = Field(
        description="c: share of the window's requests whose retrieval had a trusted chunk (m1)"
    )
    epsilon: BoundEstimate = Field(
        description="eps: share of the labelled covered requests that were wrong and not abstained"
    )
    delta: BoundEstimate = Field(
        description="delta (leakage): the rate of wrong, not abstained answers without "
        "evidence, from the source delta_source names"
    )
    delta_source: Literal["probe", "labelled-uncovered", "none"] = Field(
        description="where delta comes from: probe (the leakage probe file), "
        "labelled-uncovered (labels of uncovered requests), none (neither: the bound is not "
        "computed)"
    )
    bound: Probability | None = Field(
        description="the bound on the hallucination rate, c * epsilon + (1 - c) * delta at "
        "the point estimates; null when status is insufficient-data"
    )
    bound_low: Probability | None = Field(
        description="lowest value of the bound over the Wilson intervals of c, epsilon and "
        "delta; null when status is insufficient-data"
    )
    bound_high: Probability | None = Field(
        description="highest value of the bound over those intervals; null when status is "
        "insufficient-data"
    )
    measured_hallucination: BoundEstimate = Field(
        description="the hallucination rate measured from feedback: wrong, not abstained "
        "answers among all labelled requests of the window"
    )
    measured_by_stratum: Probability | None = Field(
        default=None,
        description="c * epsilon + (1 - c) * delta of labelled uncovered answers: the measured "
        "rate that does not lean to the stratum users label more; status compares the bound "
        "with its interval (null without labels in both strata)",
    )
    measured_by_stratum_low: Probability | None = Field(
        default=None,
        description="low end of measured_by_stratum over the Wilson intervals of its terms; "
        "null when measured_by_stratum is null",
    )
    measured_by_stratum_high: Probability | None = Field(
        default=None,
        description="high end of measured_by_stratum over those intervals; null when "
        "measured_by_stratum is null",
    )
    status: Literal["holds", "violated", "insufficient-data"] = Field(
        description="insufficient-data: no requests, no labelled covered request or no "
        "source for delta; violated: the low end of the by-stratum measured rate (an "
        "unlabelled stratum counting as 0..1) is above bound_high; holds: otherwise"
    )
    confidence_level: Probability = Field(
        description="the level of every interval in the report (GUARDRAIL_COVERAGE__"
        "CONFIDENCE, default 0.95), each on its own"
    )
    certificate: CertificateStatus | None = Field(
        default=None, description="the key's allow certificate re-tested on feedback, if any"
    )
    instance: str | None = Field(
        default=None,
        description="the replica that counted this window (its host name: the pod's name "
        "under Kubernetes); each replica reports its own partitions' traffic",
    )
    produced_at: datetime = Field(description="when the replica wrote it (UTC)")
    sidecar_version: str = Field(description="version of the sidecar that wrote it")


class CertificateWithdrawal(EventBase):
    """A calibration key's certified allow, withdrawn for the whole fleet.

    On ``rag.certificates`` (compacted, keyed by the calibration key). The replica
    whose re-test found the certificate violated publishes it once; every replica
    reads the topic from its start before it is ready, and follows it while it
    serves. A replica withdraws the certified allow of ``calibration_key`` while the
    certificates it serves for that key are exactly ``certificates`` (a new
    certificate, from ``guardrail calibrate policy``, is not withdrawn). A restart
    does not reinstate it; a tombstone (``guardrail certificates reinstate KEY``)
    does, and every replica then starts that key's re-test window afresh.
    """

    event_type: Literal["certificate.withdrawn"] = Field(
        default="certificate.withdrawn", description="always certificate.withdrawn"
    )
    calibration_key: str = Field(
        min_length=1,
        max_length=1024,
        description="the key whose certified allow is withdrawn, 'tenant/collection/"
        "retriever' (also the record's key)",
    )
    certificates: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(
        min_length=1,
        max_length=64,
        description="fingerprints of the key's certificates when it was withdrawn "
        "(sha256 of each certificate's JSON, first 16 hex digits)",
    )
    risk: Probability = Field(description="the withdrawn certificate's certified risk")
    delta: Probability = Field(description="the withdrawn certificate's delta")
    # a replica's window holds at most a million labels (GUARDRAIL_COVERAGE__WINDOW)
    labelled: int = Field(
        ge=1, le=1_000_000, description="labelled allowed answers in the re-test window"
    )
    errors: int = Field(ge=0, le=1_000_000, description="wrong among them")
    error_low: Probability = Field(
        description="low end of the Clopper-Pearson interval of errors / labelled at the "
        "replica's coverage confidence: above risk, which is why it was withdrawn"
    )
    error_high: Probability = Field(description="high end of that interval")
    # every verdict the withdrawal decides names the replica: bounded as a host name is
    instance: str | None = Field(
        default=None, max_length=253, description="the replica that withdrew it"
    )
    withdrawn_at: datetime = Field(description="when the replica withdrew it (UTC)")
    sidecar_version: str = Field(
        max_length=64, description="version of the sidecar that withdrew it"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.errors > self.labelled:
            raise ValueError(f"errors ({self.errors}) exceed labelled ({self.labelled})")
        if self.error_low > self.error_high:
            raise ValueError(f"error_low ({self.error_low}) above error_high ({self.error_high})")
        return self
