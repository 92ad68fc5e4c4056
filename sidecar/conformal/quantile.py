"""The finite-sample conformal quantile, computed exactly (eq. 2).

The formula and its source: docs/methods.md §Retrieval certification.

For ``n`` calibration nonconformity scores and a significance level alpha, split
conformal prediction uses the ``k``-th smallest score with

    k = ceil((n + 1)(1 - alpha)),

which is eq. (2)'s "delta-percentile" with delta = ceil((n+1)(1-alpha)) / n written as a rank.
alpha is held as a :class:`fractions.Fraction` (a float such as ``0.1`` is read by
its shortest decimal representation, so ``0.1`` is exactly 1/10) and ``k`` is
computed with integer arithmetic: no floating-point ceiling can land one rank
off. When ``k > n`` the calibration set is too small for that alpha: q_hat = +inf and the
certificate is vacuous (every chunk passes, eq. 3 holds trivially). That case is
reported with :attr:`ConformalQuantile.finite` and :meth:`ConformalQuantile.explain`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ConfigError, InputError

__all__ = [
    "AlphaLike",
    "ConformalQuantile",
    "as_alpha",
    "conformal_quantile",
    "explain_rank",
    "min_calibration_size",
    "order_statistic_rank",
]

AlphaLike: TypeAlias = float | str | Fraction
"""A significance level: a float (read by its shortest repr), a decimal string or a Fraction."""


def as_alpha(alpha: AlphaLike) -> Fraction:
    """Return alpha as an exact fraction, checking 0 < alpha < 1.

    A float is converted through its shortest decimal representation
    (``repr(0.1) == "0.1"`` -> 1/10), which is what the user typed; a string is
    parsed as a decimal or ``p/q`` fraction. Raises :class:`ConfigError` otherwise.
    """
    if isinstance(alpha, bool):
        raise ConfigError(f"alpha must be a number in (0, 1), got {alpha!r}")
    try:
        if isinstance(alpha, Fraction):
            value = alpha
        elif isinstance(alpha, float | int):
            if not math.isfinite(alpha):
                raise ConfigError(f"alpha must be a finite number in (0, 1), got {alpha!r}")
            value = Fraction(repr(float(alpha)))
        elif isinstance(alpha, str):
            value = Fraction(alpha.strip())
        else:
            raise ConfigError(f"alpha must be a float, str or Fraction, got {type(alpha).__name__}")
    except (ValueError, ZeroDivisionError) as exc:
        raise ConfigError(f"alpha must be a number in (0, 1), got {alpha!r}") from exc
    if not (0 < value < 1):
        raise ConfigError(f"alpha must be in (0, 1), got {alpha!r}")
    return value


def order_statistic_rank(n: int, alpha: AlphaLike) -> int:
    """The rank ``k = ceil((n + 1)(1 - alpha))`` of the conformal quantile among ``n`` scores.

    Exact (rational arithmetic). ``k`` is always >= 1 for alpha < 1 and may exceed
    ``n`` (then q_hat = +inf).
    """
    if isinstance(n, bool) or n < 0:
        raise ConfigError(f"n must be a non-negative integer, got {n!r}")
    a = as_alpha(alpha)
    return math.ceil((n + 1) * (1 - a))


def min_calibration_size(alpha: AlphaLike) -> int:
    """Smallest ``n`` with ``k <= n``, i.e. ``n >= (1 - alpha)/alpha``: below it q_hat is +inf."""
    a = as_alpha(alpha)
    return math.ceil((1 - a) / a)


@dataclass(frozen=True, slots=True)
class ConformalQuantile:
    """The order statistic q_hat of ``n`` nonconformity scores at level alpha (rank ``k``)."""

    alpha: Fraction
    n: int
    k: int
    q_hat: float
    """The ``k``-th smallest score; ``math.inf`` when ``k > n``."""

    @property
    def finite(self) -> bool:
        """True when ``k <= n``: q_hat is a calibration score and the certificate is informative."""
        return self.k <= self.n

    def explain(self) -> str:
        """A sentence saying which order statistic was used, or why none could be."""
        return explain_rank(self.alpha, self.n, self.k)


def explain_rank(alpha: Fraction, n: int, k: int) -> str:
    """Human-readable account of the rank ``k`` among ``n`` scores at level ``alpha``."""
    if k <= n:
        return (
            f"q_hat is the k={k}-th smallest of n={n} nonconformity scores "
            f"(k = ceil((n+1)(1-alpha)), alpha={float(alpha):g})"
        )
    return (
        f"nothing can be certified at alpha={float(alpha):g}: "
        f"k = ceil((n+1)(1-alpha)) = {k} exceeds n={n} calibration scores, "
        "so q_hat = +inf and every chunk passes "
        f"(needs n >= {min_calibration_size(alpha)} correct chunks)"
    )


def conformal_quantile(nonconformity: npt.ArrayLike, alpha: AlphaLike) -> ConformalQuantile:
    """Exact split-conformal quantile of a 1-D array of nonconformity scores (eq. 2).

    Returns the ``k``-th smallest value with ``k = ceil((n+1)(1-alpha))`` (1-based), or
    +inf when ``k > n``. Raises :class:`InputError` (``invalid-score``) for NaN or
    infinite scores and :class:`ConfigError` for an alpha outside (0, 1).
    """
    a = as_alpha(alpha)
    scores = np.asarray(nonconformity, dtype=np.float64)
    if scores.ndim != 1:
        raise InputError(
            "invalid-score", f"nonconformity scores must be 1-D, got shape {scores.shape}"
        )
    if not np.all(np.isfinite(scores)):
        bad = int(np.count_nonzero(~np.isfinite(scores)))
        raise InputError(
            "invalid-score", f"nonconformity scores must be finite, got {bad} NaN/inf value(s)"
        )
    n = int(scores.size)
    k = order_statistic_rank(n, a)
    if k > n:
        return ConformalQuantile(alpha=a, n=n, k=k, q_hat=math.inf)
    q_hat = float(np.partition(scores, k - 1)[k - 1])
    return ConformalQuantile(alpha=a, n=n, k=k, q_hat=q_hat)
