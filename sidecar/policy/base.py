"""The contract every policy keeps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sidecar.contracts.events import (
    Decision,
    GenerationFinal,
    Reason,
    RetrievalEvent,
    RetrievalSignal,
    Signals,
)

if TYPE_CHECKING:
    from sidecar.pipeline.signals import ClaimResult


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    decision: Decision
    reasons: list[Reason]
    caveat_text: str | None = None
    rewritten_answer: str | None = None
    extra_reasons: list[Reason] = field(default_factory=list)
    escalate: bool = False  # seed 001 pattern 3: route to a human expert / stronger model


class Policy(Protocol):
    """Decides one complete answer from its events and signals."""

    @property
    def name(self) -> str:
        """Name and version, carried in every verdict."""
        ...

    def decide(
        self,
        retrieval: RetrievalEvent,
        final: GenerationFinal,
        signals: Signals,
        *,
        claims: Sequence[ClaimResult] | None = None,
        confidence: float | None = None,
    ) -> PolicyOutcome:
        """``claims``: the per-claim results (texts, spans, labels) for the rewrite;
        ``confidence``: the calibrated p(correct), ``None`` when not configured."""
        ...

    def check_stream(
        self,
        retrieval: RetrievalEvent,
        claims: Sequence[ClaimResult],
        certification: RetrievalSignal | None = None,
    ) -> PolicyOutcome | None:
        """Strict mode: an outcome (block) as soon as the claims so far demand it."""
        ...
