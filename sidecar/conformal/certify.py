"""Per-event certification of a retrieval (eqs. 4-6, docs/methods.md §Retrieval certification).

This is the function the sidecar calls for every retrieval event: it takes the
raw vector-store scores of the K retrieved chunks, normalises them with the
calibration's n1, n2 (clipping and counting scores outside that range),
keeps the chunks with normalised score ``s >= 1 - q_hat`` as the trusted set C
(eq. 4) and reports ``m1 = |C| > 0`` (eq. 5) and ``m2 = |C| / K`` (eq. 6).

Pure Python on purpose: K is 5-10 and a numpy round trip would cost more
than the arithmetic. NaN, infinite or non-numeric scores raise
:class:`InputError` with ``reason="invalid-score"`` (the event goes to the DLQ).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real

from sidecar.conformal.calibrator import ConformalCalibration
from sidecar.conformal.mondrian import GLOBAL_KEY_LABEL
from sidecar.conformal.registry import ResolvedCalibration
from sidecar.exceptions import InputError

__all__ = ["Certification", "certify", "trusted_set"]


OUT_OF_RANGE_SPANS = 1.0
"""A raw score further than this many calibration spans (n2 - n1) below n1 or above n2
is rejected (``score-out-of-range``) rather than clipped and trusted: a retriever whose
scores drift that far is not the retriever that was calibrated, and a finite-but-absurd
score (1e308) is an attack, not a chunk."""


@dataclass(frozen=True, slots=True)
class Certification:
    """The certificate of one retrieval: which chunks are trusted, and on what basis."""

    trusted_indices: tuple[int, ...]
    """Positions (in the event's order) of the chunks in C, eq. (4)."""
    m1: bool
    """Eq. (5): at least one trusted chunk."""
    m2: float
    """Eq. (6): ``|C| / K`` (0.0 for an empty retrieval)."""
    depth: int
    """K of eq. (6): the requested depth, or the number of scores in the event."""
    normalised_scores: tuple[float, ...]
    alpha: float
    q_hat: float | None
    """The conformal quantile; ``None`` when it is +inf (``certifiable`` is False)."""
    threshold: float | None
    """``1 - q_hat`` on the normalised scale; ``None`` when q_hat is +inf."""
    certifiable: bool
    """False when the calibration is vacuous at this alpha: every chunk passes."""
    calibration_id: str
    calibration_key: str
    """``tenant/collection/retriever`` of the calibration used, or ``global``."""
    requested_key: str | None
    fallback: bool
    fallback_reason: str | None
    n_clipped: int
    """Scores outside the calibration range [n1, n2], clipped to 0 or 1."""


def certify(
    raw_scores: Sequence[float],
    calibration: ResolvedCalibration | ConformalCalibration,
    *,
    depth: int | None = None,
    calibration_id: str = "unversioned",
) -> Certification:
    """Certify one retrieval's raw scores with a resolved (or plain) calibration.

    ``calibration`` is what :meth:`CalibrationRegistry.resolve` returned for the
    event's (tenant, collection, retriever); a bare :class:`ConformalCalibration`
    is accepted for offline use (then ``calibration_id`` names it). ``depth`` is
    the K of eq. (6) when the event asked for more chunks than it got (default:
    the number of scores). Raises :class:`InputError` ``invalid-score`` for NaN,
    inf or non-numeric scores and ``invalid-depth`` for a depth below that number.
    """
    if isinstance(calibration, ResolvedCalibration):
        cal = calibration.calibration
        cal_id = calibration.calibration_id
        used = calibration.used_key
        requested: str | None = calibration.requested_label
        reason = calibration.reason_text
        alpha = calibration.alpha
    else:
        cal = calibration
        cal_id = calibration_id
        used = GLOBAL_KEY_LABEL
        requested = None
        reason = None
        alpha = float(cal.alpha)

    trusted, normalised, n_clipped, depth = trusted_set(raw_scores, cal, depth)
    certifiable = cal.certifiable
    return Certification(
        trusted_indices=tuple(trusted),
        m1=bool(trusted),
        m2=len(trusted) / depth if depth else 0.0,
        depth=depth,
        normalised_scores=tuple(normalised),
        alpha=alpha,
        q_hat=cal.q_hat if certifiable else None,
        threshold=cal.threshold if certifiable else None,
        certifiable=certifiable,
        calibration_id=cal_id,
        calibration_key=used,
        requested_key=requested,
        fallback=reason is not None,
        fallback_reason=reason,
        n_clipped=n_clipped,
    )


def trusted_set(
    raw_scores: Sequence[float], cal: ConformalCalibration, depth: int | None = None
) -> tuple[list[int], list[float], int, int]:
    """Eq. (4) on one retrieval's raw scores: the positions of the trusted chunks, the
    normalised scores (clipped to [0, 1]), how many were clipped, and the depth K
    (``depth``, or the number of scores). Raises as :func:`certify` does.

    The sidecar's certifier reads these without building a :class:`Certification`
    (its 15 frozen fields and tuples were ~9 us of the ~27 a retrieval cost).
    """
    n1 = cal.n1
    span = cal.n2 - cal.n1
    threshold = cal.threshold
    normalised: list[float] = []
    trusted: list[int] = []
    n_clipped = 0
    for j, raw in enumerate(raw_scores):
        v = _normalised(j, raw, n1, cal.n2, span)
        # eq. 4 on the unclipped score: a score below n1 fails a threshold of 0
        if v >= threshold:
            trusted.append(j)
        if v < 0.0:
            v = 0.0
            n_clipped += 1
        elif v > 1.0:
            v = 1.0
            n_clipped += 1
        normalised.append(v)

    if depth is None:
        depth = len(normalised)
    elif depth < len(normalised):
        raise InputError(
            "invalid-depth",
            f"depth K={depth} is smaller than the {len(normalised)} scores of the retrieval",
        )
    return trusted, normalised, n_clipped, depth


def _normalised(j: int, raw: object, n1: float, n2: float, span: float) -> float:
    """Score ``j`` normalised (not yet clipped); rejects non-numbers and absurd values."""
    value: object = raw  # events are validated upstream, but not trusted here
    if type(value) is float:  # the common case, checked first
        s = value
    elif not isinstance(value, bool) and isinstance(value, Real):
        s = float(value)
    else:
        raise InputError(
            "invalid-score", f"retrieval score {j} is {raw!r}; scores must be finite numbers"
        )
    if not math.isfinite(s):
        raise InputError(
            "invalid-score", f"retrieval score {j} is {s!r}; scores must be finite numbers"
        )
    # Same operations as MinMaxNormaliser.transform: subtract, divide by the span.
    v = (s - n1) / span
    if not -OUT_OF_RANGE_SPANS <= v <= 1.0 + OUT_OF_RANGE_SPANS:
        raise InputError(
            "score-out-of-range",
            f"retrieval score {j} is {s!r}, more than {OUT_OF_RANGE_SPANS:g} calibration "
            f"span(s) outside the calibrated range [{n1:.6g}, {n2:.6g}]: not a score "
            "this retriever produces; it is not trusted",
        )
    return v
