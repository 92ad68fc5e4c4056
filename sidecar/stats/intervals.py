"""Confidence intervals for a binomial proportion.

The Wilson score interval (Wilson 1927; Newcombe 1998, method 3) is the interval
recommended for rates near 0 or 1 and for small counts, where the Wald interval
``p ± z*sqrt(p(1-p)/n)`` collapses to a point or leaves [0, 1]. For ``x``
successes in ``n`` trials, ``p = x/n`` and ``z`` the standard normal quantile of
``1 - (1 - confidence)/2``::

    centre = (p + z^2/(2n)) / (1 + z^2/n)
    half   = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/(4n^2))

Pure functions, no I/O; used by the conformal exchangeability monitor and by the
retrieval-coverage hallucination bound (docs/methods.md §Coverage bound).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

from sidecar.exceptions import ConfigError

__all__ = ["ProportionInterval", "normal_quantile", "wilson_interval"]


@dataclass(frozen=True, slots=True)
class ProportionInterval:
    """A two-sided interval for a proportion, with the counts it was computed from."""

    successes: int
    trials: int
    confidence: float
    low: float
    high: float

    @property
    def estimate(self) -> float:
        """The point estimate ``successes / trials`` (NaN when there were no trials)."""
        return self.successes / self.trials if self.trials else math.nan


@functools.lru_cache(maxsize=64)  # a few configured levels, asked after every observation
def normal_quantile(confidence: float) -> float:
    """Two-sided standard-normal critical value ``z`` for ``confidence`` (0.95 -> 1.95996...)."""
    if not (0.0 < confidence < 1.0) or not math.isfinite(confidence):
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> ProportionInterval:
    """Wilson score interval for ``successes`` out of ``trials`` at the two-sided ``confidence``.

    With no trials the interval is the whole of [0, 1] (nothing is known). Cached:
    the monitors ask after every observation, and a full window's counts repeat.
    Raises :class:`ConfigError` for negative counts, ``successes > trials`` or a
    confidence outside (0, 1).
    """
    return _wilson_interval(successes, trials, confidence)


# typed: True is refused, never read as the cached 1 (a cache's wrapper takes any
# hashable arguments, so wilson_interval keeps the signature the type checker reads)
@functools.lru_cache(maxsize=4096, typed=True)
def _wilson_interval(successes: int, trials: int, confidence: float) -> ProportionInterval:
    if isinstance(successes, bool) or isinstance(trials, bool):
        raise ConfigError("successes and trials must be integers, got a bool")
    if trials < 0 or successes < 0:
        raise ConfigError(
            f"successes and trials must be >= 0, got successes={successes}, trials={trials}"
        )
    if successes > trials:
        raise ConfigError(f"successes must be <= trials, got {successes} > {trials}")
    z = normal_quantile(confidence)
    if trials == 0:
        return ProportionInterval(successes, trials, confidence, 0.0, 1.0)
    n = float(trials)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denom
    half = (z / denom) * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n))
    # The exact interval contains 0 when x = 0 and 1 when x = n; clamp rounding noise.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return ProportionInterval(successes, trials, confidence, low, high)
