"""The one metrics module: AUROC, ECE, Brier, NLL and reliability bins, in numpy.

The serving side and the lab both use it (scikit-learn only checks it in tests).
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

- AUROC = P(score of a positive > score of a negative), ties counted 1/2: the
  Mann-Whitney U over average ranks, ``(sum of positive ranks - n+(n+ + 1)/2) / (n+ n-)``.

Pure numpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ConfigError, DataError

__all__ = [
    "FloatArray",
    "ReliabilityBin",
    "as_labels",
    "as_probabilities",
    "as_scores",
    "auroc",
    "brier",
    "ece",
    "nll",
    "reliability_bins",
]


FloatArray = npt.NDArray[np.float64]


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
        raise DataError(f"{name} must not be empty")
    bad = np.flatnonzero(~np.isfinite(s))
    if bad.size:
        raise DataError(f"{name} must be finite, got {s[bad[0]]!r} at index {int(bad[0])}")
    return s


def as_probabilities(probs: npt.ArrayLike) -> FloatArray:
    """``probs`` as a non-empty 1-D float64 array of finite values in [0, 1]."""
    p = as_scores(probs, name="probabilities")
    bad = np.flatnonzero((p < 0.0) | (p > 1.0))
    if bad.size:
        raise DataError(
            f"probabilities must be in [0, 1], got {p[bad[0]]!r} at index {int(bad[0])}"
        )
    return p


def as_labels(labels: npt.ArrayLike, n: int) -> FloatArray:
    """``labels`` as a 1-D float64 array of ``n`` values, each 0 or 1 (bools allowed)."""
    raw = np.asarray(labels).ravel()
    if raw.size != n:
        raise DataError(f"got {n} forecasts but {raw.size} labels: lengths must match")
    try:
        y = raw.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"labels must be 0 or 1, got dtype {raw.dtype}") from exc
    bad = np.flatnonzero((y != 0.0) & (y != 1.0))
    if bad.size:
        raise DataError(f"labels must be 0 or 1, got {raw[bad[0]]!r} at index {int(bad[0])}")
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


def auroc(scores: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties count 1/2.

    Mann-Whitney U over average ranks. Raises ``ConfigError`` unless both classes occur,
    :class:`DataError` for a NaN score (a NaN sorts last: it would rank highest). Infinite
    scores rank first or last, tied with each other.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    if s.shape != y.shape:
        raise ConfigError(f"{s.shape[0]} scores for {y.shape[0]} labels")
    bad = np.flatnonzero(np.isnan(s))
    if bad.size:
        raise DataError(f"scores must not be NaN, got one at index {int(bad[0])}")
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise ConfigError(f"AUROC needs both classes, got {n_pos} positives and {n_neg} negatives")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # Average ranks (1-based) over runs of tied scores.
    boundaries = np.flatnonzero(sorted_s[1:] != sorted_s[:-1]) + 1  # inf - inf is NaN: no diff
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [s.size]))
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + 1 + end) / 2.0
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))
