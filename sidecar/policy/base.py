"""The contract every policy keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sidecar.contracts.events import (
    Decision,
    GenerationFinal,
    Reason,
    RetrievalEvent,
    Signals,
)


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    decision: Decision
    reasons: list[Reason]
    caveat_text: str | None = None
    rewritten_answer: str | None = None
    extra_reasons: list[Reason] = field(default_factory=list)


class Policy(Protocol):
    """Decides one complete answer from its events and signals."""

    @property
    def name(self) -> str:
        """Name and version, carried in every verdict."""
        ...

    def decide(
        self, retrieval: RetrievalEvent, final: GenerationFinal, signals: Signals
    ) -> PolicyOutcome: ...
