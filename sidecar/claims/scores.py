"""The answer-level scores from claim labels: reliability and hallucination rate.

The formulas are those of docs/methods.md §Claim verification. Reliability::

    reliability = (supported + 0.5 * uncertain) / total_claims
    HIGH if reliability >= 0.85, MEDIUM if >= 0.65, else LOW
    no claims -> reliability 1.0, HIGH

Hallucination rate::

    factual_claims = len(claims) - irrelevant
    hallucination_rate = unverified / factual_claims   (0.0 when factual_claims == 0)

(the four-way "unverified" is our ``unsupported``).

The three-way labels have no ``irrelevant``; the four-way source leaves
irrelevant claims out of the denominator because "it's unfair to penalize the
LLM for correctly stating" general knowledge. The sidecar applies the same rule
to reliability: its denominator is ``N - irrelevant`` (identical to ``N`` when
nothing is irrelevant, which is always the case without the LLM judge). The
four-way ``partially_verified`` is our ``uncertain``.

Threshold comparisons use exact fractions, so 17 supported of 20 is HIGH
(0.85 exactly), never a float rounding away from it. An answer without
claims scores as the sources say (1.0 / HIGH / 0.0); the policy reports it with
its own reason (``claims-none``) instead of treating it as fine. Pure logic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal

from sidecar.contracts.events import ClaimLabel, ClaimsSignal, SignalStatus

__all__ = [
    "HIGH_FROM",
    "MEDIUM_FROM",
    "ClaimCounts",
    "hallucination_rate",
    "reliability",
    "reliability_level",
    "summarise",
]

HIGH_FROM: Final = Fraction(85, 100)
MEDIUM_FROM: Final = Fraction(65, 100)
Level = Literal["HIGH", "MEDIUM", "LOW"]
Scope = Literal["trusted", "all-retrieved"]


@dataclass(frozen=True, slots=True)
class ClaimCounts:
    supported: int = 0
    unsupported: int = 0
    uncertain: int = 0
    irrelevant: int = 0

    @property
    def n(self) -> int:
        return self.supported + self.unsupported + self.uncertain + self.irrelevant

    @property
    def factual(self) -> int:
        return self.n - self.irrelevant

    @classmethod
    def of(cls, labels: Iterable[ClaimLabel]) -> ClaimCounts:
        counts = dict.fromkeys(ClaimLabel, 0)
        for label in labels:
            counts[ClaimLabel(label)] += 1
        return cls(
            supported=counts[ClaimLabel.SUPPORTED],
            unsupported=counts[ClaimLabel.UNSUPPORTED],
            uncertain=counts[ClaimLabel.UNCERTAIN],
            irrelevant=counts[ClaimLabel.IRRELEVANT],
        )


def _reliability_fraction(c: ClaimCounts) -> Fraction:
    if c.factual == 0:
        return Fraction(1)
    return (Fraction(c.supported) + Fraction(c.uncertain, 2)) / c.factual


def reliability(c: ClaimCounts) -> float:
    """Reliability: (supported + 0.5 * uncertain) / (N - irrelevant); 1.0 without claims."""
    return float(_reliability_fraction(c))


def reliability_level(c: ClaimCounts) -> Level:
    """The level: HIGH >= 0.85, MEDIUM >= 0.65, else LOW (exact comparison)."""
    r = _reliability_fraction(c)
    if r >= HIGH_FROM:
        return "HIGH"
    if r >= MEDIUM_FROM:
        return "MEDIUM"
    return "LOW"


def hallucination_rate(c: ClaimCounts) -> float:
    """Hallucination rate: unsupported / (N - irrelevant); 0.0 when every claim is irrelevant."""
    return c.unsupported / c.factual if c.factual else 0.0


def summarise(labels: Iterable[ClaimLabel], scope: Scope) -> ClaimsSignal:
    """The ``ClaimsSignal`` of an answer from its claims' labels."""
    c = ClaimCounts.of(labels)
    return ClaimsSignal(
        status=SignalStatus.OK,
        n=c.n,
        supported=c.supported,
        unsupported=c.unsupported,
        uncertain=c.uncertain,
        irrelevant=c.irrelevant,
        reliability=reliability(c),
        reliability_level=reliability_level(c),
        hallucination_rate=hallucination_rate(c),
        evidence_scope=scope,
    )
