"""The streaming claim checker the processor plugs in (``ClaimChecker`` protocol).

Per answer (docs/methods.md §Claim verification):

1. :class:`~sidecar.claims.segment.ClaimSegmenter` cuts each completed
   sentence of the stream into atomic claims with spans into the answer; a
   claim that opens with a pronoun ("It was ...") carries the claims before
   it as its context (:mod:`sidecar.claims.context`);
2. evidence is chosen per claim (and the user's question, the retrieval
   event's ``query``, followed by the claim's context) from the **trusted**
   chunks of the retrieval certification (docs/methods.md §Retrieval certification)
   when it has any, else from all retrieved chunks, and the scope is reported
   (``evidence_scope``);
3. the verifier (:class:`~sidecar.claims.scorer.PairScorer`, in production the ONNX cross-encoder,
   which reads the question too when its artifact says so) scores the claim
   against the best sentences (and, with ``best_chunk=True``, also against
   the best chunk, the higher calibrated p(supported) counting); the band
   gives the label;
4. the rule tier (:mod:`sidecar.claims.rules`) makes a claim whose number,
   date or quantity is not in the evidence ``unsupported``;
5. optionally, claims still ``uncertain`` go to the LLM judge
   (:mod:`sidecar.claims.judge`) off the stream; its answers refine the labels
   at ``finish`` if they arrive in time; claims it was due to label and did not
   (its breaker open, its pool saturated, a failed or late call; not those past
   its per-answer call budget) are counted in ``ClaimsSignal.unjudged``;
6. ``finish`` returns the remaining claims and the ``ClaimsSignal`` with the
   answer-level scores (:mod:`sidecar.claims.scores`).

The final answer is what gets verified. When it is not the streamed text
continued (``ClaimsSignal.stream_mismatch``; the same text in another Unicode
normal form, NFC versus NFD, is no mismatch), its claims whose sentence was
verified identically from the stream keep that verdict (and index, their spans
moved into the final answer), the others are verified at ``finish``; streamed
claims it no longer holds leave :attr:`VerifierClaimSession.results` and the
summary and are listed in ``ClaimsSignal.superseded_claims``. Claims past the segmenter's per-answer
limit, and claims that come after the answer's verification budget was spent,
are counted in ``ClaimsSignal.unchecked``, never verified: one huge answer
cannot hold the sidecar for long. The budget counts work, not time: the
(claim, evidence window) pairs the verifier scored (``DEFAULT_ANSWER_PAIRS``),
so the same answer is checked as far on a busy CPU as on a quiet one and a
replay repeats its verdicts. An optional wall-clock limit
(``answer_budget_s``) caps the time as well, at the price of that.

``ClaimResult.score`` is the final p(supported): the verifier's calibrated
probability, capped at ``RULE_CAP`` when the rule tier contradicts it, or the
judge's label mapped to 0.9 / 0.5 / 0.1. All results of an answer stay
available as :attr:`VerifierClaimSession.results` (the policy's rewrite needs
the claim texts and labels, not just the counts).

No I/O here: the verifier and the judge are injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Final, Literal

from sidecar.claims.atomic import Claim
from sidecar.claims.context import with_context
from sidecar.claims.evidence import EvidenceChunk
from sidecar.claims.judge import JudgeBudget, JudgeRunner, JudgeVerdict
from sidecar.claims.scorer import ClaimCheck, ClaimScorer
from sidecar.claims.scores import summarise
from sidecar.claims.segment import ClaimSegmenter
from sidecar.contracts.events import (
    ClaimLabel,
    ClaimsSignal,
    RetrievalEvent,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.exceptions import LifecycleError
from sidecar.pipeline.ports import ClaimResult

__all__ = [
    "VerifierClaimChecker",
    "VerifierClaimSession",
    "evidence_chunks",
]

DEFAULT_ANSWER_PAIRS: Final = 64
"""Verifier pairs one answer may use (~1.5 s here at ~25 ms per pair); claims that come
after they are spent are counted ``unchecked``. A claim is verified while any are left, so
an answer may use up to ``max_windows - 1`` more."""

_JUDGE_SCORE: Final = {
    ClaimLabel.SUPPORTED: 0.9,
    ClaimLabel.UNCERTAIN: 0.5,
    ClaimLabel.UNSUPPORTED: 0.1,
}
Scope = Literal["trusted", "all-retrieved"]


def evidence_chunks(
    retrieval: RetrievalEvent, certification: RetrievalSignal
) -> tuple[list[EvidenceChunk], Scope]:
    """The trusted chunks when the certification has any, else all retrieved ones."""
    trusted = set(certification.trusted_chunk_ids)
    if certification.status is SignalStatus.OK and trusted:
        chunks = [
            EvidenceChunk(h.chunk_id, h.text) for h in retrieval.hits if h.chunk_id in trusted
        ]
        if chunks:
            return chunks, "trusted"
    return [EvidenceChunk(h.chunk_id, h.text) for h in retrieval.hits], "all-retrieved"


class VerifierClaimSession:
    """One answer's claims: ``feed`` streamed text, ``finish`` with the final answer."""

    def __init__(
        self,
        scorer: ClaimScorer,
        chunks: Sequence[EvidenceChunk],
        scope: Scope,
        *,
        question: str = "",
        judge: JudgeRunner | None = None,
        judge_labels: frozenset[ClaimLabel] = frozenset({ClaimLabel.UNCERTAIN}),
        answer_pairs: int = DEFAULT_ANSWER_PAIRS,
        answer_budget_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if answer_pairs < 1:
            raise ValueError(f"answer_pairs must be >= 1, got {answer_pairs}")
        self._scorer = scorer
        self._pair_budget = answer_pairs
        self._pairs_spent = 0
        self._budget_s = answer_budget_s
        self._clock = clock
        self._spent_s = 0.0
        self.over_budget = 0  # claims left unverified because the answer's budget was spent
        self._index = scorer.index(chunks)
        self.scope: Scope = scope
        self.question = question
        self._segmenter = ClaimSegmenter()
        self._checks: list[ClaimCheck] = []
        self._judge = judge
        self._judge_labels = judge_labels
        self._budget: JudgeBudget | None = judge.budget() if judge is not None else None
        self._pending: dict[int, tuple[Future[JudgeVerdict], float]] = {}
        # claims the judge was due to label and did not (breaker open, pool saturated, the
        # call failed or late), by claim index; the budget's own limit is not among them
        self._unjudged: set[int] = set()
        self._superseded: tuple[ClaimCheck, ...] = ()
        self._finished = False

    @property
    def held_bytes(self) -> int:
        """The evidence index's bytes (the claims and verdicts held are small and capped)."""
        return self._index.nbytes

    @property
    def results(self) -> tuple[ClaimResult, ...]:
        """Every claim of the answer so far, with its current label.

        After ``finish``: the final answer's claims, spans into the final answer.
        """
        return tuple(c.result() for c in self._checks)

    @property
    def superseded(self) -> tuple[ClaimResult, ...]:
        """Claims verified from the stream that the final answer no longer holds."""
        return tuple(c.result() for c in self._superseded)

    @property
    def checks(self) -> tuple[ClaimCheck, ...]:
        return tuple(self._checks)

    @property
    def pairs_spent(self) -> int:
        """Verifier pairs this answer has used so far."""
        return self._pairs_spent

    def _spent(self) -> bool:
        if self._pairs_spent >= self._pair_budget:
            return True
        return self._budget_s is not None and self._spent_s >= self._budget_s

    def _verify(self, claims: Sequence[Claim]) -> list[ClaimResult]:
        """Verify ``claims`` while the answer's budget lasts; the rest stay unchecked."""
        checks: list[ClaimCheck] = []
        for k, claim in enumerate(claims):  # one at a time: the budget holds within a batch
            if self._spent():  # (a final-only answer's claims come at once)
                self.over_budget += len(claims) - k
                break
            started = self._clock() if self._budget_s is not None else 0.0
            checked = self._scorer.check([claim], self._index, self.question)
            if self._budget_s is not None:
                self._spent_s += self._clock() - started
            self._pairs_spent += sum(c.pairs for c in checked)
            checks += checked
        self._checks.extend(checks)
        self._ask_judge(checks)
        return [c.result() for c in checks]

    def _ask_judge(self, checks: Sequence[ClaimCheck]) -> None:
        if self._judge is None or self._budget is None:
            return
        for check in checks:
            if check.label not in self._judge_labels or check.tier != "verifier":
                continue
            asked = with_context(self.question, check.claim.context)
            selection = self._index.select(check.claim.text, asked)
            evidence = selection.best_chunk or selection.window
            within_budget = not self._budget.spent
            future = self._judge.submit(check.claim.text, evidence, self._budget)
            if future is not None:
                deadline = time.monotonic() + self._judge.config.timeout_s
                self._pending[check.claim.index] = (future, deadline)
            elif within_budget:  # the judge could not take it: not the budget's choice
                self._unjudged.add(check.claim.index)

    def _apply_judge(self) -> None:
        if self._judge is None:
            return
        position = {c.claim.index: k for k, c in enumerate(self._checks)}
        for index, (future, deadline) in self._pending.items():
            verdict = self._judge.collect(future, deadline)
            if verdict is None:
                self._unjudged.add(index)
                continue
            k = position[index]
            old = self._checks[k]
            score = _JUDGE_SCORE.get(verdict.label, old.score)
            self._checks[k] = replace(
                old, label=verdict.label, score=score, tier="judge", detail="LLM judge"
            )
        self._pending.clear()

    def feed(self, text: str) -> list[ClaimResult]:
        return self._verify(self._segmenter.feed(text))

    def finish(self, answer: str) -> tuple[list[ClaimResult], ClaimsSignal]:
        if self._finished:
            raise LifecycleError("finish() called twice on one claim session")
        self._finished = True
        segmenter = self._segmenter
        tail_claims = segmenter.finish(answer)
        self._verify(tail_claims)
        self._apply_judge()
        by_index = {c.claim.index: c for c in self._checks}
        self._superseded = tuple(by_index[k] for k in segmenter.superseded if k in by_index)
        # the final answer's claims, in its order, with spans into it (verified ones only)
        self._checks = [
            replace(by_index[c.index], claim=c) for c in segmenter.claims if c.index in by_index
        ]
        tail_index = {c.index for c in tail_claims}
        tail = [c.result() for c in self._checks if c.claim.index in tail_index]
        signal = summarise((c.label for c in self._checks), self.scope).model_copy(
            update={
                "stream_mismatch": segmenter.mismatch,
                # only claims whose verdicts were published: a streamed claim left
                # unverified (the budget was spent) has no verdict to withdraw
                "superseded_claims": [c.claim.index for c in self._superseded],
                "unchecked": segmenter.unchecked + self.over_budget,
                "unreadable": segmenter.unreadable,
                "unjudged": sum(c.claim.index in self._unjudged for c in self._checks),
            }
        )
        return tail, signal


class VerifierClaimChecker:
    """``ClaimChecker`` for the processor: one :class:`VerifierClaimSession` per answer."""

    def __init__(
        self,
        scorer: ClaimScorer,
        *,
        judge: JudgeRunner | None = None,
        judge_labels: frozenset[ClaimLabel] = frozenset({ClaimLabel.UNCERTAIN}),
        answer_pairs: int = DEFAULT_ANSWER_PAIRS,
        answer_budget_s: float | None = None,
    ) -> None:
        if answer_pairs < 1:
            raise ValueError(f"answer_pairs must be >= 1, got {answer_pairs}")
        self._scorer = scorer
        self._judge = judge
        self._judge_labels = judge_labels
        self._answer_pairs = answer_pairs
        self._answer_budget_s = answer_budget_s

    @property
    def scorer(self) -> ClaimScorer:
        """Evidence selection + verifier + rules (the benchmark times its stages)."""
        return self._scorer

    @property
    def judge(self) -> JudgeRunner | None:
        """The LLM judge's runner, when one is configured (its counts become metrics)."""
        return self._judge

    @property
    def version(self) -> str:
        suffix = "+judge" if self._judge is not None else ""
        rules = "+rules" if self._scorer.rules else ""
        return f"{self._scorer.verifier.version}{rules}{suffix}"

    def open(
        self, retrieval: RetrievalEvent, certification: RetrievalSignal
    ) -> VerifierClaimSession:
        chunks, scope = evidence_chunks(retrieval, certification)
        return VerifierClaimSession(
            self._scorer,
            chunks,
            scope,
            question=retrieval.query,
            judge=self._judge,
            judge_labels=self._judge_labels,
            answer_pairs=self._answer_pairs,
            answer_budget_s=self._answer_budget_s,
        )

    def close(self) -> None:
        if self._judge is not None:
            self._judge.close()
