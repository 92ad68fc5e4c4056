"""The coverage report published periodically on ``rag.reports``, one per calibration key."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
