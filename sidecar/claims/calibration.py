"""From the verifier's logit to supported / uncertain / unsupported.

Seed 001 has three verification labels (SUPPORTED, UNSUPPORTED, UNCERTAIN:
"the context partially addresses the claim but is ambiguous"); seed 002 four
(verified, partially_verified, unverified, irrelevant). The cross-encoder is a
binary classifier (supported or not); ``uncertain`` is a *calibrated band* of
its supported-probability:

1. Platt scaling with one extra input, fitted on the validation split by
   logistic regression (Newton's method, small L2; the fit is the lab's,
   :mod:`sidecar.lab.verifier.calibration`)::

       p = sigmoid(logit_scale * logit + coverage_weight * coverage + bias)

   where ``coverage`` (:func:`coverage`) is the share of the claim's content
   words and numbers found in the evidence text. On held-out HaluEval pairs
   lexical coverage alone ranks declarative claims better than the small
   CPU-trained cross-encoder, and the two together better than either; with
   ``coverage_weight = 0`` this is plain temperature scaling;
2. ``supported_from`` = the smallest threshold at which the validation
   precision of "supported" reaches ``target_precision``; ``unsupported_below``
   = the largest threshold at which the precision of "unsupported" (p below it)
   reaches ``target_precision``. Between them the label is ``uncertain``.
   When the two cross, the band collapses to one threshold (no uncertain).

``irrelevant`` never comes from the verifier (only from the LLM judge with
seed 002's prompt). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sidecar.claims.evidence import content_terms, uncovered_terms
from sidecar.contracts.events import ClaimLabel
from sidecar.exceptions import ConfigError

__all__ = ["Band", "Platt", "coverage", "sigmoid"]


def sigmoid(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * arr)), dtype=np.float64)


def coverage(claim: str, evidence: str, question: str = "") -> float:
    """Share of the claim's content terms found in the evidence (numbers count twice).

    With ``question``, only the terms the question does not already state
    count (:func:`~sidecar.claims.evidence.uncovered_terms`): what the answer adds.
    """
    terms = set(uncovered_terms(claim, question))
    if not terms:
        return 1.0
    have = set(content_terms(evidence))
    weight = {t: 2.0 if t[0].isdigit() else 1.0 for t in terms}
    return sum(w for t, w in weight.items() if t in have) / sum(weight.values())


@dataclass(frozen=True, slots=True)
class Platt:
    """``p = sigmoid(logit_scale * logit + coverage_weight * coverage + bias)``."""

    logit_scale: float = 1.0
    coverage_weight: float = 0.0
    bias: float = 0.0

    def probability(
        self, logits: npt.ArrayLike, coverages: npt.ArrayLike
    ) -> npt.NDArray[np.float64]:
        z = np.asarray(logits, dtype=np.float64)
        c = np.asarray(coverages, dtype=np.float64)
        return sigmoid(self.logit_scale * z + self.coverage_weight * c + self.bias)


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
