"""Factories for the claim tests: a lexical stand-in for the ONNX verifier, events."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sidecar.claims.calibration import Band
from sidecar.claims.evidence import content_terms
from sidecar.contracts.events import RetrievalEvent, RetrievalHit

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class LexicalVerifier:
    """p(supported) = share of the claim's content words found in the evidence."""

    version: str = "lexical/1"
    band: Band = field(default_factory=lambda: Band(0.4, 0.8))
    calls: list[tuple[str, str]] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> list[float]:
        self.calls.extend(pairs)
        self.questions.extend(questions if questions is not None else [""] * len(pairs))
        out = []
        for claim, evidence in pairs:
            terms = set(content_terms(claim))
            have = set(content_terms(evidence))
            out.append(len(terms & have) / len(terms) if terms else 0.0)
        return out

    def window_probabilities(
        self,
        claims: Sequence[str],
        windows: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[float]:
        asked = list(questions) if questions is not None else [""] * len(claims)
        out = []
        for claim, found, question in zip(claims, windows, asked, strict=True):
            probs = self.probabilities([(claim, w) for w in found], [question] * len(found))
            out.append(max(probs, default=0.0))
        return out


@pytest.fixture
def lexical() -> LexicalVerifier:
    return LexicalVerifier()


RetrievalFactory = Callable[..., RetrievalEvent]


@pytest.fixture
def retrieval() -> RetrievalFactory:
    def make(*texts: str, tenant: str = "acme", collection: str = "docs") -> RetrievalEvent:
        hits = [
            RetrievalHit(chunk_id=f"c{k}", doc_id=f"d{k}", score=0.9 - 0.1 * k, text=t)
            for k, t in enumerate(texts)
        ]
        return RetrievalEvent(
            request_id="req-1",
            tenant=tenant,
            collection=collection,
            query="q",
            k=max(1, len(hits)),
            hits=hits,
        )

    return make
