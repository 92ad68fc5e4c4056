"""Calibration metrics of a probabilistic forecaster, in numpy: ECE, Brier, NLL, reliability bins.

Where they are used: docs/methods.md §Calibrated confidence.

For ``n`` forecasts ``p_i`` in [0, 1] of binary outcomes ``y_i`` in {0, 1}:

- Expected Calibration Error (Naeini et al. 2015) over ``B`` equal-width bins of
  [0, 1] (bin ``b`` holds ``b/B <= p < (b+1)/B``; ``p = 1`` goes in the last bin)::

      ECE = sum_b |B_b|/n * |acc(B_b) - conf(B_b)|

  where ``acc`` is the mean label and ``conf`` the mean forecast of the bin;
  empty bins contribute nothing.
- Brier score (Brier 1950): ``BS = 1/n sum_i (p_i - y_i)^2``.
- Negative log-likelihood: ``NLL = -1/n sum_i [y_i log p_i + (1 - y_i) log(1 - p_i)]``
  with ``p`` clipped to ``[eps, 1 - eps]`` so a confident miss costs ``-log eps``, not infinity.

AUROC lives in :func:`sidecar.lookback.metrics.auroc`. Pure numpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sidecar.confidence.errors import ConfidenceDataError
from sidecar.confidence.logistic import FloatArray
from sidecar.exceptions import ConfigError

__all__ = [
    "ReliabilityBin",
    "as_labels",
    "as_probabilities",
    "as_scores",
    "brier",
    "ece",
    "nll",
    "reliability_bins",
]


@dataclass(frozen=True, slots=True)
class ReliabilityBin:
    """One bin ``[lower, upper)`` of a reliability diagram (the last bin also holds 1.0).

    ``mean_confidence`` and ``accuracy`` are ``None`` for an empty bin.
    """

    lower: float
    upper: float
    count: int
    mean_confidence: float | None
    accuracy: float | None


def as_scores(scores: npt.ArrayLike, *, name: str = "scores") -> FloatArray:
    """``scores`` as a non-empty 1-D float64 array of finite values."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    if s.size == 0:
        raise ConfidenceDataError(f"{name} must not be empty")
    bad = np.flatnonzero(~np.isfinite(s))
    if bad.size:
        raise ConfidenceDataError(
            f"{name} must be finite, got {s[bad[0]]!r} at index {int(bad[0])}"
        )
    return s


def as_probabilities(probs: npt.ArrayLike) -> FloatArray:
    """``probs`` as a non-empty 1-D float64 array of finite values in [0, 1]."""
    p = as_scores(probs, name="probabilities")
    bad = np.flatnonzero((p < 0.0) | (p > 1.0))
    if bad.size:
        raise ConfidenceDataError(
            f"probabilities must be in [0, 1], got {p[bad[0]]!r} at index {int(bad[0])}"
        )
    return p


def as_labels(labels: npt.ArrayLike, n: int) -> FloatArray:
    """``labels`` as a 1-D float64 array of ``n`` values, each 0 or 1 (bools allowed)."""
    raw = np.asarray(labels).ravel()
    if raw.size != n:
        raise ConfidenceDataError(f"got {n} forecasts but {raw.size} labels: lengths must match")
    try:
        y = raw.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfidenceDataError(f"labels must be 0 or 1, got dtype {raw.dtype}") from exc
    bad = np.flatnonzero((y != 0.0) & (y != 1.0))
    if bad.size:
        raise ConfidenceDataError(
            f"labels must be 0 or 1, got {raw[bad[0]]!r} at index {int(bad[0])}"
        )
    return y


def _check_bins(bins: int) -> None:
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ConfigError(f"bins must be a positive integer, got {bins!r}")


def reliability_bins(
    probs: npt.ArrayLike, labels: npt.ArrayLike, bins: int = 10
) -> list[ReliabilityBin]:
    """All ``bins`` equal-width bins of [0, 1] with their count, mean forecast and accuracy.

    Bin of ``p`` = ``min(floor(p * bins), bins - 1)``.
    """
    _check_bins(bins)
    p = as_probabilities(probs)
    y = as_labels(labels, p.size)
    index = np.minimum((p * bins).astype(np.int64), bins - 1)
    counts = np.bincount(index, minlength=bins)
    sum_p = np.bincount(index, weights=p, minlength=bins)
    sum_y = np.bincount(index, weights=y, minlength=bins)
    out: list[ReliabilityBin] = []
    for b in range(bins):
        count = int(counts[b])
        out.append(
            ReliabilityBin(
                lower=b / bins,
                upper=(b + 1) / bins,
                count=count,
                mean_confidence=float(sum_p[b] / count) if count else None,
                accuracy=float(sum_y[b] / count) if count else None,
            )
        )
    return out


def ece(probs: npt.ArrayLike, labels: npt.ArrayLike, bins: int = 10) -> float:
    """``sum_b |B_b|/n * |acc(B_b) - conf(B_b)|`` over the non-empty equal-width bins."""
    table = reliability_bins(probs, labels, bins)
    n = sum(b.count for b in table)
    return float(
        sum(
            b.count / n * abs(b.accuracy - b.mean_confidence)
            for b in table
            if b.accuracy is not None and b.mean_confidence is not None
        )
    )


def brier(probs: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """``mean((p - y)^2)``."""
    p = as_probabilities(probs)
    y = as_labels(labels, p.size)
    return float(np.mean((p - y) ** 2))


def nll(probs: npt.ArrayLike, labels: npt.ArrayLike, eps: float = 1e-12) -> float:
    """``-mean(y log p + (1 - y) log(1 - p))`` with ``p`` clipped to ``[eps, 1 - eps]``."""
    if not 0.0 < eps < 0.5:
        raise ConfigError(f"eps must be in (0, 0.5), got {eps!r}")
    p = np.clip(as_probabilities(probs), eps, 1.0 - eps)
    y = as_labels(labels, p.size)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
