"""From the verifier's logit to supported / uncertain / unsupported.

Seed 001 has three verification labels (SUPPORTED, UNSUPPORTED, UNCERTAIN:
"the context partially addresses the claim but is ambiguous"); seed 002 four
(verified, partially_verified, unverified, irrelevant). The cross-encoder is a
binary classifier (supported or not); ``uncertain`` is a *calibrated band* of
its supported-probability:

1. temperature scaling (one scalar ``T``, fitted on the validation split by
   minimising the negative log-likelihood): ``p = sigmoid(logit / T)``;
2. ``supported_from`` = the smallest threshold at which the validation
   precision of "supported" reaches ``target_precision``; ``unsupported_below``
   = the largest threshold at which the precision of "unsupported" (p below it)
   reaches ``target_precision``. Between them the label is ``uncertain``.
   When the two cross, the band collapses to one threshold (no uncertain).

``irrelevant`` never comes from the verifier (only from the LLM judge with
seed 002's prompt). Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sidecar.contracts.events import ClaimLabel
from sidecar.exceptions import ConfigError

__all__ = ["Band", "fit_band", "fit_temperature", "sigmoid"]


def sigmoid(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * arr)), dtype=np.float64)


def _nll(logits: npt.NDArray[np.float64], labels: npt.NDArray[np.float64], t: float) -> float:
    p = np.clip(sigmoid(logits / t), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def fit_temperature(logits: Sequence[float], labels: Sequence[int]) -> float:
    """The temperature minimising validation NLL (golden-section search on log T)."""
    if len(logits) < 10 or len(set(labels)) < 2:
        raise ConfigError(
            f"temperature scaling needs >= 10 validation pairs of both classes, got {len(logits)}"
        )
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    lo, hi = math.log(0.05), math.log(20.0)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(80):
        if _nll(z, y, math.exp(a)) < _nll(z, y, math.exp(b)):
            hi = b
        else:
            lo = a
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    return math.exp((lo + hi) / 2)


@dataclass(frozen=True, slots=True)
class Band:
    """The uncertain band: ``[unsupported_below, supported_from)`` is ``uncertain``."""

    unsupported_below: float
    supported_from: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.unsupported_below <= self.supported_from <= 1.0:
            raise ConfigError(
                "band needs 0 <= unsupported_below <= supported_from <= 1, got "
                f"{self.unsupported_below}, {self.supported_from}"
            )

    def label(self, p: float) -> ClaimLabel:
        if p >= self.supported_from:
            return ClaimLabel.SUPPORTED
        if p < self.unsupported_below:
            return ClaimLabel.UNSUPPORTED
        return ClaimLabel.UNCERTAIN


def fit_band(
    probs: Sequence[float],
    labels: Sequence[int],
    target_precision: float = 0.9,
    max_width: float = 0.5,
) -> Band:
    """The uncertain band from validation probabilities (see the module docstring)."""
    if not 0.5 <= target_precision < 1.0:
        raise ConfigError(f"target_precision must be in [0.5, 1), got {target_precision}")
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    grid = np.round(np.linspace(0.02, 0.98, 97), 4)
    supported_from = 0.98
    for t in grid:
        sel = p >= t
        if sel.sum() >= 5 and y[sel].mean() >= target_precision:
            supported_from = float(t)
            break
    unsupported_below = 0.02
    for t in grid[::-1]:
        sel = p < t
        if sel.sum() >= 5 and (1 - y[sel]).mean() >= target_precision:
            unsupported_below = float(t)
            break
    if unsupported_below >= supported_from:
        mid = round((unsupported_below + supported_from) / 2, 4)
        return Band(mid, mid)
    if supported_from - unsupported_below > max_width:
        centre = (supported_from + unsupported_below) / 2
        return Band(round(centre - max_width / 2, 4), round(centre + max_width / 2, 4))
    return Band(unsupported_below, supported_from)
