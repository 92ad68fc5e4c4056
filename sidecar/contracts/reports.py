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


class CoverageReport(EventBase):
    """Fleet-level coverage bound for one calibration key, published periodically.

    The bound of docs/methods.md §Coverage bound, H <= c * epsilon + (1 - c) *
    delta, with Wilson intervals propagated to the bound's ends, compared with
    the hallucination rate measured from feedback.
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
    measured_by_stratum: Probability | None = Field(
        default=None,
        description="c * epsilon + (1 - c) * delta of labelled uncovered answers: the measured "
        "rate that does not lean to the stratum users label more; status compares the bound "
        "with its interval (null without labels in both strata)",
    )
    measured_by_stratum_low: Probability | None = None
    measured_by_stratum_high: Probability | None = None
    status: Literal["holds", "violated", "insufficient-data"]
    confidence_level: Probability
    certificate: CertificateStatus | None = Field(
        default=None, description="the key's allow certificate re-tested on feedback, if any"
    )
    instance: str | None = Field(
        default=None,
        description="the replica that counted this window (its host name: the pod's name "
        "under Kubernetes); each replica reports its own partitions' traffic",
    )
    produced_at: datetime
    sidecar_version: str


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

    event_type: Literal["certificate.withdrawn"] = "certificate.withdrawn"
    calibration_key: str = Field(min_length=1, max_length=1024)
    certificates: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(
        min_length=1,
        max_length=64,
        description="fingerprints of the key's certificates when it was withdrawn "
        "(sha256 of each certificate's JSON, first 16 hex digits)",
    )
    risk: Probability
    delta: Probability
    # a replica's window holds at most a million labels (GUARDRAIL_COVERAGE__WINDOW)
    labelled: int = Field(
        ge=1, le=1_000_000, description="labelled allowed answers in the re-test window"
    )
    errors: int = Field(ge=0, le=1_000_000, description="wrong among them")
    error_low: Probability
    error_high: Probability
    # every verdict the withdrawal decides names the replica: bounded as a host name is
    instance: str | None = Field(
        default=None, max_length=253, description="the replica that withdrew it"
    )
    withdrawn_at: datetime
    sidecar_version: str = Field(max_length=64)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.errors > self.labelled:
            raise ValueError(f"errors ({self.errors}) exceed labelled ({self.labelled})")
        if self.error_low > self.error_high:
            raise ValueError(f"error_low ({self.error_low}) above error_high ({self.error_high})")
        return self
