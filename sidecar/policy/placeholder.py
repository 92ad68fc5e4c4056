"""A placeholder policy for a sidecar with no signals configured.

It never allows: with nothing measured, the honest answer is "show it with a
caveat". Replaced by the declarative policy engine once signals exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sidecar.contracts.events import (
    Decision,
    GenerationFinal,
    Reason,
    RetrievalEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)

if TYPE_CHECKING:
    from sidecar.pipeline.ports import ClaimResult
from sidecar.pipeline.ports import PolicyOutcome

NO_SIGNALS = Reason(
    code="no-signals-configured",
    message="placeholder policy: no retrieval, lookback or claim signal is configured",
    signal="policy",
)


class PlaceholderPolicy:
    """Always ``caveat`` with reason ``no-signals-configured``."""

    name = "placeholder/0"
    fingerprint = "placeholder/0"
    profile_names: tuple[str, ...] = ()

    def decide(
        self,
        retrieval: RetrievalEvent,
        final: GenerationFinal,
        signals: Signals,
        *,
        claims: Sequence[ClaimResult] | None = None,
        confidence: float | None = None,
        confidence_status: SignalStatus = SignalStatus.NOT_CONFIGURED,
    ) -> PolicyOutcome:
        del retrieval, final, signals, claims, confidence, confidence_status
        return PolicyOutcome(
            decision=Decision.CAVEAT,
            reasons=[NO_SIGNALS],
            caveat_text="This answer has not been checked against its sources.",
        )

    def check_stream(
        self,
        retrieval: RetrievalEvent,
        claims: Sequence[ClaimResult],
        certification: RetrievalSignal | None = None,
    ) -> PolicyOutcome | None:
        del retrieval, claims, certification
        return None
