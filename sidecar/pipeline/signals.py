"""Where the three signals plug into the processor.

Each signal is a small component behind a protocol; the processor calls them
at fixed points of a request's life and knows nothing of their internals:

* ``RetrievalCertifier.certify``  when the retrieval event arrives (seed 000 section 3.2);
* ``ClaimChecker.open`` once the retrieval event is there, then ``ClaimSession.feed``
  with each newly contiguous piece of streamed text (claim verdicts go out as
  soon as their sentence completes) and ``ClaimSession.finish`` with the final
  answer (seeds 001, 002);
* ``LookbackScorer.score`` when the final event arrives (seed 000 section 3.3).

A component raises ``InputError`` when the event cannot be scored and must be
dead-lettered (a wrong attention shape, NaN scores); anything it returns with
status ``unavailable`` is carried in the verdict instead. A signal that is not
configured is reported as ``not-configured``, never silently treated as fine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sidecar.contracts.events import (
    ClaimLabel,
    ClaimsSignal,
    GenerationFinal,
    LookbackSignal,
    RetrievalEvent,
    RetrievalSignal,
    SignalStatus,
)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One verified claim; the processor turns it into a ``ClaimVerdict`` event."""

    index: int
    span: tuple[int, int]
    text: str
    label: ClaimLabel
    score: float
    evidence_chunk_ids: tuple[str, ...] = ()


class RetrievalCertifier(Protocol):
    @property
    def version(self) -> str: ...

    def certify(self, event: RetrievalEvent) -> RetrievalSignal: ...


class LookbackScorer(Protocol):
    @property
    def version(self) -> str: ...

    def check(self, final: GenerationFinal) -> None:
        """Raise ``InputError`` when the final event's summary cannot be scored by this model
        (wrong generator, wrong shape) and the configuration says dead-letter."""
        ...

    def score(self, final: GenerationFinal, certification: RetrievalSignal) -> LookbackSignal: ...

    def score_batch(
        self, items: Sequence[tuple[GenerationFinal, RetrievalSignal]]
    ) -> list[LookbackSignal]:
        """Score the answers completed in one consumed batch with one model call."""
        ...


class ClaimSession(Protocol):
    def feed(self, text: str) -> list[ClaimResult]:
        """Newly streamed text; returns results for claims whose sentence completed."""
        ...

    def finish(self, answer: str) -> tuple[list[ClaimResult], ClaimsSignal]:
        """The final answer: results for the remaining claims, and the summary."""
        ...


class ClaimChecker(Protocol):
    @property
    def version(self) -> str: ...

    def open(self, retrieval: RetrievalEvent, certification: RetrievalSignal) -> ClaimSession: ...


@dataclass(frozen=True, slots=True)
class SignalSuite:
    """The configured signal components; ``None`` means not configured."""

    certifier: RetrievalCertifier | None = None
    lookback: LookbackScorer | None = None
    claims: ClaimChecker | None = None

    def versions(self) -> dict[str, str]:
        out = {}
        for name, part in (
            ("certifier", self.certifier),
            ("lookback", self.lookback),
            ("verifier", self.claims),
        ):
            if part is not None:
                out[name] = part.version
        return out


NOT_CONFIGURED_RETRIEVAL = RetrievalSignal(status=SignalStatus.NOT_CONFIGURED)
NOT_CONFIGURED_LOOKBACK = LookbackSignal(status=SignalStatus.NOT_CONFIGURED)
NOT_CONFIGURED_CLAIMS = ClaimsSignal(status=SignalStatus.NOT_CONFIGURED)
