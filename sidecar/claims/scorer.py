"""Scoring claims against a chunk set: evidence windows, the verifier, the rule tier (ClaimScorer).

For each claim (docs/methods.md §Claim verification) the evidence index picks
the best sentences of the chunks (the user's question steers it, followed by
the claim's context when it opens with a pronoun: :mod:`sidecar.claims.context`);
the verifier (:class:`PairScorer`, in production the ONNX cross-encoder) gives a
calibrated p(supported) against that window, or against up to
``max_windows`` windows with the best one winning, and the band gives the
label; the rule tier (:mod:`sidecar.claims.rules`) caps at ``RULE_CAP`` a
claim whose number, date or quantity is not in the evidence. No I/O: the
verifier is injected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Protocol

from sidecar.claims.atomic import Claim
from sidecar.claims.calibration import Band
from sidecar.claims.context import with_context
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex, EvidenceSelection
from sidecar.claims.rules import check_quantities
from sidecar.contracts.events import ClaimLabel
from sidecar.pipeline.ports import ClaimResult

if TYPE_CHECKING:  # the ONNX verifier imports onnxruntime; the scorer takes any PairScorer
    from sidecar.claims.verifier import OnnxVerifier

__all__ = ["RULE_CAP", "ClaimCheck", "ClaimScorer", "PairScorer", "Tier"]

RULE_CAP: Final = 0.05
Tier = Literal["verifier", "rule", "judge", "no-evidence"]


class PairScorer(Protocol):
    """Calibrated p(supported) for (claim, evidence) pairs, and the band that labels it."""

    @property
    def version(self) -> str: ...

    @property
    def band(self) -> Band: ...

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> list[float]: ...

    def window_probabilities(
        self,
        claims: Sequence[str],
        windows: Sequence[Sequence[str]],
        questions: Sequence[str] | None = None,
    ) -> list[float]:
        """p(supported) per claim against its evidence windows, the best window winning."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimCheck:
    """A verified claim with how it was decided (for audit)."""

    claim: Claim
    label: ClaimLabel
    score: float
    verifier_p: float
    evidence_chunk_ids: tuple[str, ...]
    tier: Tier
    detail: str = ""
    pairs: int = 0  # (claim, evidence) pairs the verifier scored for it: its cost

    def result(self) -> ClaimResult:
        return ClaimResult(
            index=self.claim.index,
            span=self.claim.span,
            text=self.claim.text,
            label=self.label,
            score=min(1.0, max(0.0, self.score)),
            evidence_chunk_ids=self.evidence_chunk_ids,
        )


class ClaimScorer:
    """Evidence selection + verifier + rule tier for claims against a chunk set.

    One verifier pair per claim (the window of best sentences) by default;
    ``best_chunk=True`` adds a second pair against the best sentence's whole
    chunk when it fits (the higher probability counts), at twice the cost.
    """

    def __init__(
        self,
        verifier: PairScorer,
        *,
        rules: bool = True,
        max_sentences: int = 3,
        max_chars: int = 450,
        best_chunk: bool = False,
        max_windows: int = 1,
    ) -> None:
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows}")
        self.verifier = verifier
        self.rules = rules
        self.max_sentences = max_sentences
        self.max_chars = max_chars
        self.best_chunk = best_chunk
        self.max_windows = max_windows

    @classmethod
    def served(
        cls, verifier: OnnxVerifier, *, rules: bool = True, best_chunk: bool = False
    ) -> ClaimScorer:
        """The scorer the sidecar serves ``verifier`` with: the evidence windows its
        artifact was exported for (sentences, characters and windows per claim)."""
        artifact = verifier.artifact
        return cls(
            verifier,
            rules=rules,
            max_sentences=artifact.evidence_max_sentences,
            max_chars=artifact.evidence_max_chars,
            best_chunk=best_chunk,
            max_windows=artifact.evidence_max_windows,
        )

    def index(self, chunks: Sequence[EvidenceChunk]) -> EvidenceIndex:
        return EvidenceIndex(chunks, max_sentences=self.max_sentences, max_chars=self.max_chars)

    def check(
        self, claims: Sequence[Claim], index: EvidenceIndex, question: str = ""
    ) -> list[ClaimCheck]:
        """Label every claim (one verifier call for all of them).

        ``question``: the user's question the answer replies to ("" when
        unknown); it steers evidence selection and goes to the verifier. A
        claim with a context (it opens with a pronoun) is read with the
        question followed by its context (:func:`~sidecar.claims.context.with_context`).
        """
        if not claims:
            return []
        if not index.chunks:
            return [
                ClaimCheck(c, ClaimLabel.UNSUPPORTED, 0.0, 0.0, (), "no-evidence", "no chunks")
                for c in claims
            ]
        asked = [with_context(question, c.context) for c in claims]
        selections = [index.select(c.text, q) for c, q in zip(claims, asked, strict=True)]
        if self.max_windows > 1:
            best, pairs = self._windowed(claims, index, asked)
        else:
            best, pairs = self._selected(claims, selections, asked)
        all_text = "\n".join(chunk.text for chunk in index.chunks)
        band = self.verifier.band
        out: list[ClaimCheck] = []
        for claim, sel, p, n in zip(claims, selections, best, pairs, strict=True):
            label = band.label(p)
            ids = sel.chunk_ids
            if self.rules:
                rule = check_quantities(claim.text, all_text)
                if rule.contradicted:
                    out.append(
                        ClaimCheck(
                            claim, ClaimLabel.UNSUPPORTED, min(p, RULE_CAP), p, ids, "rule",
                            rule.describe(), n,
                        )
                    )  # fmt: skip
                    continue
            out.append(ClaimCheck(claim, label, p, p, ids, "verifier", pairs=n))
        return out

    def _selected(
        self,
        claims: Sequence[Claim],
        selections: Sequence[EvidenceSelection],
        questions: Sequence[str],
    ) -> tuple[list[float], list[int]]:
        """One pair per claim (its window of best sentences), plus its best chunk if asked.

        Returns each claim's best probability and how many pairs it took.
        """
        pairs: list[tuple[str, str]] = []
        owners: list[int] = []
        for k, (claim, sel) in enumerate(zip(claims, selections, strict=True)):
            pairs.append((claim.text, sel.window))
            owners.append(k)
            if self.best_chunk and sel.best_chunk is not None:
                pairs.append((claim.text, sel.best_chunk))
                owners.append(k)
        probs = self.verifier.probabilities(pairs, [questions[k] for k in owners])
        best = [0.0] * len(claims)
        counts = [0] * len(claims)
        for k, p in zip(owners, probs, strict=True):
            best[k] = max(best[k], p)
            counts[k] += 1
        return best, counts

    def _windowed(
        self, claims: Sequence[Claim], index: EvidenceIndex, questions: Sequence[str]
    ) -> tuple[list[float], list[int]]:
        """Every claim against up to ``max_windows`` evidence windows; the best window wins.

        The same scoring ``guardrail eval claims --format pairs`` measures
        (:meth:`EvidenceIndex.windows` then one verifier call).
        """
        windows = [
            index.windows(c.text, q, max_windows=self.max_windows, max_chars=self.max_chars)
            for c, q in zip(claims, questions, strict=True)
        ]
        texts = [c.text for c in claims]
        probs = self.verifier.window_probabilities(texts, windows, list(questions))
        return probs, [len(ws) for ws in windows]
