"""Certified allow: an allow threshold on the calibrated confidence with a finite-sample guarantee.

Learn then Test (Angelopoulos, Bates, Candes, Jordan, Lei 2021) with fixed-sequence
testing. From ``n`` labelled answers (calibrated confidence, correct or not), for
each threshold ``t`` of a grid fixed in advance, strictest first, test

    H0(t): P(wrong | allowed at t) > risk,      allowed at t  <=>  confidence >= t

with the exact binomial tail: given that ``m`` answers are allowed at ``t`` they
are ``m`` independent draws from the allowed population, so their errors ``e``
are Binomial(m, error rate at t) and ``p(t) = P(Binomial(m, risk) <= e)`` is a
valid p-value for H0(t). Walk the grid downwards; reject while ``p(t) <= delta``
and stop at the first failure (the procedure never tests past it). Fixed-
sequence testing controls the family-wise error at ``delta`` for any
dependence between the p-values, so the last rejected threshold ``t*`` gives

    P( P(wrong | confidence >= t*) <= risk ) >= 1 - delta      over the calibration draw.

Thresholds at the strict end that allow fewer than ``min_testable(risk, delta)``
answers cannot be rejected even with no error (``(1 - risk)^m > delta``), and
those that allow barely more would stop the walk at once by chance; the walk
starts at the first threshold allowing :func:`start_size` answers (enough to
reject at half the risk) and at least ``START_SHARE`` of them: a prefix of the
grid decided by the unlabelled confidences only, never by labels. The statistical test in
``tests/confidence/test_certify_allow.py`` checks the guarantee with this rule
over 1,000 simulated calibration draws.

What it promises and what it does not: the guarantee is on the *population* of
answers like the calibration ones (same generator, retriever, confidence model
and traffic); it is not a promise about any single answer, nor about traffic
that drifted, which is why the sidecar re-tests it online on feedback labels
(:class:`~sidecar.confidence.certificate_check.CertificateTracker`).

The certificate (:class:`AllowCertificate`, format ``allow-certificate/1``)
records its calibration key, n, risk, delta, the threshold, the data hash, the
confidence model's version and, when fitted for a policy profile, the hash of
that profile's other rules; a mismatch at load is a ``ConfigError``.
Pure numpy/stdlib, no I/O except :func:`load_certificate`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Final, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sidecar.confidence.certificate_check import check_level
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.stats.binomial import binomial_cdf

__all__ = [
    "CERTIFICATE_FORMAT",
    "DEFAULT_GRID",
    "AllowCertificate",
    "LttResult",
    "ProfileScope",
    "TestedThreshold",
    "certificate_data_hash",
    "learn_then_test",
    "load_certificate",
    "min_testable",
    "smallest_certifiable_risk",
    "start_size",
]

CERTIFICATE_FORMAT: Final = "allow-certificate/1"
PROCEDURE: Final = "ltt-fixed-sequence-binomial"
DEFAULT_GRID: tuple[float, ...] = tuple(round(i / 100, 2) for i in range(99, -1, -1))
"""Thresholds 0.99, 0.98, ..., 0.00: fixed before any data is seen, strictest first."""
START_SHARE = 0.05
"""The walk starts where at least this share of the calibration answers is allowed."""
RISK_RESOLUTION = 0.005
"""Step of the scan for the smallest certifiable risk."""

Outcome = Literal["untestable", "rejected", "failed"]
Unit = Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


def min_testable(risk: float, delta: float) -> int:
    """The fewest allowed answers for which H0 can be rejected at all: ``(1-risk)^m <= delta``."""
    risk, delta = check_level("risk", risk), check_level("delta", delta)
    m = math.ceil(math.log(delta) / math.log1p(-risk))
    # guard the float edge: make sure m really rejects and m - 1 really does not
    while binomial_cdf(0, m, risk) > delta:
        m += 1
    while m > 1 and binomial_cdf(0, m - 1, risk) <= delta:
        m -= 1
    return max(1, m)


def start_size(risk: float, delta: float) -> int:
    """Where the walk starts: the fewest allowed answers that reject H0 at half the risk.

    The smallest ``m >= min_testable`` with ``P(Binomial(m, risk) <= floor(m * risk / 2))
    <= delta``. A walk that started where a single unlucky error already fails
    the test (a handful of answers at the strictest thresholds) would stop at
    once by chance; this size depends on ``risk`` and ``delta`` only, never on data.
    """
    m = min_testable(risk, delta)
    while binomial_cdf(math.floor(m * risk / 2.0), m, risk) > delta:
        m += 1
    return m


@dataclass(frozen=True, slots=True)
class TestedThreshold:
    """One step of the walk: ``allowed`` answers at ``threshold``, ``errors`` of them wrong."""

    threshold: float
    allowed: int
    errors: int
    p_value: float | None  # None: untestable (too few answers allowed)
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class LttResult:
    """The outcome of :func:`learn_then_test` on one calibration set."""

    risk: float
    delta: float
    n: int
    steps: tuple[TestedThreshold, ...]
    threshold: float | None  # the certified threshold; None: nothing certified

    @property
    def certified(self) -> bool:
        return self.threshold is not None

    @property
    def tested(self) -> int:
        """Hypotheses actually tested (rejected ones and the first failure)."""
        return sum(1 for s in self.steps if s.outcome != "untestable")

    @property
    def chosen(self) -> TestedThreshold | None:
        """The step of the certified threshold."""
        rejected = [s for s in self.steps if s.outcome == "rejected"]
        return rejected[-1] if rejected else None

    @property
    def stopped_at(self) -> float | None:
        """The threshold whose test failed first (the walk stopped there)."""
        failed = [s for s in self.steps if s.outcome == "failed"]
        return failed[0].threshold if failed else None


def _as_arrays(
    confidence: Sequence[float] | npt.ArrayLike, correct: Sequence[int] | npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    p = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(correct)
    if p.ndim != 1 or y.shape != p.shape:
        raise ConfidenceDataError(
            f"confidence and correct must be 1-d and of equal length, got {p.shape} and {y.shape}"
        )
    if p.size == 0:
        raise ConfidenceDataError("no labelled answers to certify on")
    if not np.all(np.isfinite(p)) or p.min() < 0.0 or p.max() > 1.0:
        raise ConfidenceDataError("confidence values must be finite probabilities in [0, 1]")
    if not np.isin(y, (0, 1)).all():
        raise ConfidenceDataError("correct must hold 0/1 (or False/True) labels")
    return p, y.astype(bool)


def _check_grid(grid: Sequence[float]) -> tuple[float, ...]:
    values = tuple(float(t) for t in grid)
    if not values:
        raise ConfigError("the threshold grid is empty")
    if any(not (0.0 <= t <= 1.0) for t in values):
        raise ConfigError("grid thresholds must be in [0, 1]")
    if any(b >= a for a, b in itertools.pairwise(values)):
        raise ConfigError("the grid must be strictly decreasing (strictest threshold first)")
    return values


def learn_then_test(
    confidence: Sequence[float] | npt.ArrayLike,
    correct: Sequence[int] | npt.ArrayLike,
    *,
    risk: float,
    delta: float,
    grid: Sequence[float] = DEFAULT_GRID,
    min_allowed: int | None = None,
) -> LttResult:
    """Fixed-sequence Learn-then-Test of ``P(wrong | confidence >= t) <= risk`` down ``grid``.

    Thresholds allowing fewer than ``min_allowed`` answers are skipped as
    untestable; the walk starts after them. Default: :func:`start_size`, and at
    least ``START_SHARE`` of the answers (a few answers at the very top decide
    nothing about a threshold worth using, and two unlucky ones there would end
    the walk at every risk).
    """
    risk, delta = check_level("risk", risk), check_level("delta", delta)
    thresholds = _check_grid(grid)
    p, y = _as_arrays(confidence, correct)
    wrong = ~y
    if min_allowed is None:
        need = max(start_size(risk, delta), math.ceil(START_SHARE * p.size))
    else:
        need = min_allowed
    if isinstance(need, bool) or need < 1:
        raise ConfigError(f"min_allowed must be a positive number of answers, got {need!r}")
    steps: list[TestedThreshold] = []
    certified: float | None = None
    for t in thresholds:
        allowed = p >= t
        m = int(allowed.sum())
        e = int((wrong & allowed).sum())
        if m < need and certified is None:
            steps.append(TestedThreshold(t, m, e, None, "untestable"))
            continue
        p_value = binomial_cdf(e, m, risk)
        if p_value <= delta:
            steps.append(TestedThreshold(t, m, e, p_value, "rejected"))
            certified = t
            continue
        steps.append(TestedThreshold(t, m, e, p_value, "failed"))
        break  # fixed sequence: never test past the first failure
    return LttResult(risk=risk, delta=delta, n=int(p.size), steps=tuple(steps), threshold=certified)


def smallest_certifiable_risk(
    confidence: Sequence[float] | npt.ArrayLike,
    correct: Sequence[int] | npt.ArrayLike,
    *,
    delta: float,
    grid: Sequence[float] = DEFAULT_GRID,
    resolution: float = RISK_RESOLUTION,
) -> float | None:
    """The smallest risk on a ``resolution`` grid at which :func:`learn_then_test` certifies."""
    steps = round(1.0 / resolution)
    for i in range(1, steps):
        risk = round(i * resolution, 6)
        if learn_then_test(confidence, correct, risk=risk, delta=delta, grid=grid).certified:
            return risk
    return None


def certificate_data_hash(
    qids: Sequence[object], confidence: Sequence[float], correct: Sequence[int]
) -> str:
    """sha256 over the sorted (question id, confidence, label) triples certified on."""
    triples = sorted(
        (str(q), round(float(c), 9), int(bool(y)))
        for q, c, y in zip(qids, confidence, correct, strict=True)
    )
    return hashlib.sha256(json.dumps(triples, separators=(",", ":")).encode()).hexdigest()


# --------------------------------------------------------------------------- the artifact


class ProfileScope(BaseModel):
    """The certificate covers the answers a policy profile's other rules let through."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str
    rules_sha256: str = Field(description="sha256 of the profile's rules other than `allow`")


class AllowCertificate(BaseModel):
    """What ``guardrail calibrate policy`` certified, and on what."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    format: Literal["allow-certificate/1"] = CERTIFICATE_FORMAT
    procedure: Literal["ltt-fixed-sequence-binomial"] = PROCEDURE
    key: str = Field(description="calibration key tenant/collection/retriever")
    risk: Unit = Field(description="bound on P(wrong | allowed)")
    delta: Unit = Field(description="the bound fails for at most this share of calibration draws")
    certified: bool
    threshold: Probability | None = Field(description="allow when confidence >= threshold")
    n: int = Field(ge=1, description="labelled answers certified on (the eligible ones)")
    n_rows: int = Field(ge=1, description="calibration rows, eligible or not (scope)")
    allowed: int = Field(ge=0, description="calibration answers allowed at the threshold")
    errors_allowed: int = Field(ge=0)
    allow_rate: Probability = Field(description="allowed / n_rows")
    error_rate_allowed: Probability | None
    p_value: Probability | None
    tested: int = Field(ge=0, description="hypotheses tested (the walk stops at a failure)")
    stopped_at: Probability | None = Field(description="threshold of the first failed test")
    smallest_certifiable_risk: Probability | None
    grid: list[float]
    scope: ProfileScope | None = Field(
        default=None, description="None: all answers; else the answers a profile's rules allow"
    )
    data_hash: str
    rows: list[str] = Field(default_factory=list, description="where the labels came from")
    confidence_model: str = Field(description="version of the calibrated-confidence model")
    model_versions: dict[str, str] = Field(default_factory=dict)
    created_at: datetime

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.certified != (self.threshold is not None):
            raise ValueError("certified and threshold must agree (a threshold iff certified)")
        if self.allowed > self.n or self.errors_allowed > self.allowed or self.n > self.n_rows:
            raise ValueError("need errors_allowed <= allowed <= n <= n_rows")
        return self

    @classmethod
    def from_result(
        cls,
        result: LttResult,
        *,
        key: str,
        smallest_risk: float | None,
        grid: Sequence[float],
        data_hash: str,
        confidence_model: str,
        created_at: datetime,
        scope: ProfileScope | None = None,
        rows: Sequence[str] = (),
        model_versions: dict[str, str] | None = None,
        n_rows: int | None = None,
    ) -> AllowCertificate:
        """``n_rows``: all calibration rows when only the eligible ones were tested."""
        chosen = result.chosen
        total = result.n if n_rows is None else n_rows
        allowed = chosen.allowed if chosen else 0
        errors = chosen.errors if chosen else 0
        return cls(
            key=key,
            risk=result.risk,
            delta=result.delta,
            certified=result.certified,
            threshold=result.threshold,
            n=result.n,
            n_rows=total,
            allowed=allowed,
            errors_allowed=errors,
            allow_rate=allowed / total,
            error_rate_allowed=errors / allowed if allowed else None,
            p_value=chosen.p_value if chosen else None,
            tested=result.tested,
            stopped_at=result.stopped_at,
            smallest_certifiable_risk=smallest_risk,
            grid=list(grid),
            scope=scope,
            data_hash=data_hash,
            rows=list(rows),
            confidence_model=confidence_model,
            model_versions=dict(model_versions or {}),
            created_at=created_at,
        )

    def summary(self) -> str:
        """One sentence for logs and the CLI."""
        if not self.certified:
            smallest = (
                f"smallest certifiable risk {self.smallest_certifiable_risk:g}"
                if self.smallest_certifiable_risk is not None
                else "no risk below 1 is certifiable"
            )
            return (
                f"nothing can be certified at risk {self.risk:g} (delta {self.delta:g}) with "
                f"{self.n} labels; {smallest}"
            )
        if self.threshold is None:  # certified implies a threshold (checked by the model)
            raise ConfigError("a certified certificate needs a threshold")
        smallest = (
            f" (smallest certifiable risk {self.smallest_certifiable_risk:g})"
            if self.smallest_certifiable_risk is not None
            else ""
        )
        return (
            f"allow when confidence >= {self.threshold:g}: P(wrong | allowed) <= {self.risk:g} "
            f"with probability >= {1 - self.delta:g}{smallest}; of the {self.n_rows} calibration "
            f"answers it allows {self.allowed} ({self.allow_rate:.1%}), {self.errors_allowed} of "
            "them wrong"
        )


def load_certificate(path: Path) -> AllowCertificate:
    """Read a certificate file; ``ArtifactError`` when it is missing or not a certificate."""
    if not path.is_file():
        raise ArtifactError(f"allow certificate {path} does not exist")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"allow certificate {path} is not readable JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != CERTIFICATE_FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ArtifactError(
            f"{path} is not an allow certificate (format {got!r}, expected {CERTIFICATE_FORMAT})"
        )
    try:
        return AllowCertificate.model_validate(raw)
    except ValidationError as exc:
        raise ArtifactError(f"allow certificate {path} is invalid: {exc}") from None
