"""The streaming ClaimChecker: evidence scope, rule tier, labels, the processor contract."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
import pytest

from sidecar.claims.checker import VerifierClaimChecker, VerifierClaimSession, evidence_chunks
from sidecar.claims.evidence import EvidenceChunk, EvidenceIndex
from sidecar.claims.scorer import ClaimScorer
from sidecar.claims.segment import segment_claims
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    ClaimLabel,
    ClaimVerdict,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.ports import ClaimChecker, ClaimSession, SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy.config import load_policy
from sidecar.policy.engine import PolicyEngine
from tests.claims.conftest import REPO, LexicalVerifier, RetrievalFactory
from tests.conftest import EventFactory, dumps

AMPK = "Metformin reduces hepatic glucose production by activating AMPK."
HBA1C = "In clinical trials, metformin therapy reduces HbA1c by approximately 1.5%."
GENRE = "Gothic fiction is a genre of literature."


def certified(*trusted: str) -> RetrievalSignal:
    return RetrievalSignal(
        status=SignalStatus.OK, trusted_chunk_ids=list(trusted), m1=bool(trusted), m2=0.5
    )


def test_it_implements_the_processor_protocols(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    checker: ClaimChecker = VerifierClaimChecker(ClaimScorer(lexical))
    session: ClaimSession = checker.open(retrieval(AMPK), certified("c0"))
    assert session.feed("") == []
    assert checker.version == "lexical/1+rules"


def test_trusted_chunks_are_the_evidence_when_certified(retrieval: RetrievalFactory) -> None:
    event = retrieval(AMPK, GENRE)
    chunks, scope = evidence_chunks(event, certified("c1"))
    assert scope == "trusted" and [c.chunk_id for c in chunks] == ["c1"]
    chunks, scope = evidence_chunks(event, certified())
    assert scope == "all-retrieved" and len(chunks) == 2
    not_ok = RetrievalSignal(status=SignalStatus.UNAVAILABLE)
    assert evidence_chunks(event, not_ok)[1] == "all-retrieved"


def test_streamed_claims_are_labelled_and_summarised(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    checker = VerifierClaimChecker(ClaimScorer(lexical))
    session = checker.open(retrieval(AMPK, HBA1C, GENRE), certified("c0", "c1"))
    answer = (
        "Metformin activates AMPK. It reduces HbA1c by 1.5%. "
        "The starting dose is 500mg twice daily. Is it safe?"
    )
    first = session.feed(answer[:40])
    assert [r.text for r in first] == ["Metformin activates AMPK."]
    assert first[0].label is ClaimLabel.SUPPORTED and first[0].evidence_chunk_ids[0] == "c0"
    more = session.feed(answer[40:])
    tail, signal = session.finish(answer)
    results = session.results
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.label for r in results] == [
        ClaimLabel.SUPPORTED,
        ClaimLabel.SUPPORTED,
        ClaimLabel.UNSUPPORTED,  # 500 is not in the evidence: the rule tier
    ]
    assert {r.index for r in first + more + tail} == {0, 1, 2}
    assert session.checks[2].tier == "rule" and results[2].score <= 0.05
    assert (signal.n, signal.supported, signal.unsupported) == (3, 2, 1)
    assert signal.evidence_scope == "trusted"
    assert signal.reliability_level == "MEDIUM"  # 2/3
    for r in results:
        assert answer[r.span[0] : r.span[1]].rstrip(".").lower() in r.text.lower()


def test_a_number_from_an_untrusted_chunk_does_not_count(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    checker = VerifierClaimChecker(ClaimScorer(lexical))
    session = checker.open(retrieval(AMPK, HBA1C), certified("c0"))
    _, signal = session.finish("Metformin reduces HbA1c by 1.5%.")
    assert signal.unsupported == 1


def test_without_chunks_every_claim_is_unsupported(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    session = VerifierClaimChecker(ClaimScorer(lexical)).open(retrieval(), certified())
    _, signal = session.finish("Paris is the capital of France.")
    assert signal.unsupported == 1 and signal.evidence_scope == "all-retrieved"


def test_evidence_selection_prefers_overlapping_sentences() -> None:
    index = EvidenceIndex(
        [EvidenceChunk("a", f"{GENRE} {AMPK}"), EvidenceChunk("b", HBA1C)], max_sentences=1
    )
    sel = index.select("HbA1c falls by 1.5% with metformin.")
    assert sel.window == HBA1C and sel.chunk_ids == ("b",)
    assert sel.overlap > 0.5
    long = EvidenceIndex([EvidenceChunk("x", "word " * 200 + "AMPK is activated.")], max_chars=60)
    assert "AMPK" in long.select("AMPK activation").window


def test_evidence_selection_ranks_by_the_question_too() -> None:
    premiere = "Steven Spielberg attended the premiere in Los Angeles."
    answer = "Inception was directed by Christopher Nolan."
    index = EvidenceIndex([EvidenceChunk("a", f"{premiere} {answer}")], max_sentences=1)
    claim = "Steven Spielberg directed the film."
    alone = index.select(claim)
    assert alone.window == premiere  # the wrong name pulls in the sentence that mentions it
    asked = index.select(claim, "Who directed Inception?")
    assert asked.window == answer  # the sentence answering the question wins
    assert index.select(claim, "").window == premiere  # empty question: claim alone
    assert asked.overlap < alone.overlap  # overlap is still the claim's own coverage


def test_the_question_reaches_selection_and_verifier_one_pair_per_claim(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    event = retrieval(f"{GENRE} {AMPK}", HBA1C).model_copy(
        update={"query": "How does metformin work?"}
    )
    session = VerifierClaimChecker(ClaimScorer(lexical)).open(event, certified())
    assert session.question == "How does metformin work?"
    session.finish("Metformin activates AMPK. Metformin reduces HbA1c.")
    assert len(lexical.calls) == 2  # one (claim, window) pair per claim by default
    assert lexical.questions == ["How does metformin work?"] * 2


def test_the_best_chunk_pair_is_optional(lexical: LexicalVerifier) -> None:
    scorer = ClaimScorer(lexical, best_chunk=True, max_sentences=1)
    index = scorer.index([EvidenceChunk("a", f"{GENRE} {AMPK}")])
    (check,) = scorer.check(segment_claims("Metformin activates AMPK."), index, "q?")
    assert len(lexical.calls) == 2 and lexical.calls[1][1] == f"{GENRE} {AMPK}"
    assert lexical.questions == ["q?", "q?"] and check.verifier_p == 1.0


@dataclass
class KeywordVerifier(LexicalVerifier):
    """Supports a claim only from evidence that holds ``keyword`` (a stand-in for meaning)."""

    keyword: str = "through"

    def probabilities(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> list[float]:
        self.calls.extend(pairs)
        return [0.9 if self.keyword in evidence else 0.2 for _, evidence in pairs]


def test_a_claim_is_scored_against_several_windows_and_the_best_one_wins() -> None:
    # The sentence sharing most words with the claim ranks first but does not
    # support it; the one that does ranks second, outside a 60-character window.
    first = "Metformin activates AMPK in many tissues except liver."
    second = "Metformin acts through AMPK."
    chunks = [EvidenceChunk("a", f"{first} {second}")]
    claim = segment_claims("Metformin activates AMPK in the liver.")
    one = ClaimScorer(KeywordVerifier(), max_chars=60, max_windows=1)
    four = ClaimScorer(KeywordVerifier(), max_chars=60, max_windows=4)
    windows = four.index(chunks).windows(claim[0].text, "q?", max_windows=4, max_chars=60)
    assert windows == (first, second)
    (single,) = one.check(claim, one.index(chunks), "q?")
    (several,) = four.check(claim, four.index(chunks), "q?")
    assert single.verifier_p == 0.2 and several.verifier_p == 0.9
    assert several.label is ClaimLabel.SUPPORTED


def test_the_window_count_must_be_positive(lexical: LexicalVerifier) -> None:
    with pytest.raises(ValueError, match="max_windows must be >= 1"):
        ClaimScorer(lexical, max_windows=0)


def test_the_processor_publishes_claim_verdicts_and_a_policy_decision(
    lexical: LexicalVerifier,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    engine = PolicyEngine(load_policy(REPO / "models" / "policy" / "default.yaml"))
    suite = SignalSuite(claims=VerifierClaimChecker(ClaimScorer(lexical)))
    p = Processor(settings_factory(), engine, signals=suite)
    kinds = iter(range(100))

    def feed(kind: InputKind, raw: bytes) -> list[tuple[Destination, bytes]]:
        step = p.on_message(kind, raw, None, InputRef(kind.value, 0, next(kinds)), 0.0)
        return [(o.destination, o.value) for o in step.outputs]

    feed(InputKind.RETRIEVAL, dumps(retrieval_event()))
    out = feed(InputKind.GENERATION, dumps(delta_event(seq=0, text="Mary Shelley wrote Frank")))
    assert out == []
    out = feed(InputKind.GENERATION, dumps(delta_event(seq=1, text="enstein. It was 1818. ")))
    verdicts = [ClaimVerdict.model_validate(orjson.loads(v)) for _, v in out]
    assert [(v.text, v.label) for v in verdicts] == [
        ("Mary Shelley wrote Frankenstein.", ClaimLabel.SUPPORTED),
        ("It was 1818.", ClaimLabel.UNSUPPORTED),
    ]
    answer = "Mary Shelley wrote Frankenstein. It was 1818. "
    [(dest, raw)] = feed(InputKind.GENERATION, dumps(final_event(answer=answer)))
    verdict = AnswerVerdict.model_validate(orjson.loads(raw))
    assert dest is Destination.VERDICTS
    assert verdict.signals.claims.n == 2 and verdict.signals.claims.unsupported == 1
    assert verdict.policy == "default/1"
    codes = [r.code for r in verdict.reasons]
    # no certifier: evidence is all retrieved chunks, and that is said
    assert "retrieval-not-configured" in codes and "claims-evidence-untrusted" in codes
    assert "claims-hallucination-rate-exceeded" in codes  # 1/2 > 0.20 (enterprise)
    assert verdict.decision.value == "block"


def _one_second_per_call(answer_budget_s: float) -> VerifierClaimSession:
    """A session whose clock moves 1 s per reading: every verifier call "takes" 1 s."""
    ticks = iter(float(i) for i in range(1000))
    return VerifierClaimSession(
        ClaimScorer(LexicalVerifier()),
        [EvidenceChunk("c1", "Mary Shelley wrote Frankenstein. It was published in 1818.")],
        "trusted",
        answer_budget_s=answer_budget_s,
        clock=lambda: next(ticks),
    )


def test_claims_after_the_answer_budget_are_unchecked_not_verified() -> None:
    session = _one_second_per_call(answer_budget_s=1.5)
    first = session.feed("Mary Shelley wrote Frankenstein. ")
    second = session.feed("It was published in 1818. ")
    third = session.feed("Frankenstein is a novel. ")
    _, signal = session.finish(
        "Mary Shelley wrote Frankenstein. It was published in 1818. Frankenstein is a novel."
    )
    assert (len(first), len(second), third) == (1, 1, [])
    assert session.over_budget == 1 and signal.unchecked == 1
    assert signal.n == 2  # only what was verified is summarised


def test_superseded_claims_are_only_claims_whose_verdicts_were_published() -> None:
    """A streamed claim the budget left unverified has no verdict: the final answer dropping
    it withdraws nothing (a client waiting for n + len(superseded) verdicts would wait out
    its settle time for one that never comes)."""
    session = _one_second_per_call(answer_budget_s=1.5)
    published = session.feed(
        "Mary Shelley wrote Frankenstein. It was published in 1818. Frankenstein is a novel. "
    )
    assert [r.index for r in published] == [0, 1] and session.over_budget == 1
    _, signal = session.finish("Mary Shelley wrote Frankenstein. Frankenstein is long.")
    assert signal.stream_mismatch
    assert signal.superseded_claims == [1]  # claim 2 was never verified nor published
    assert set(signal.superseded_claims) <= {r.index for r in published}


def test_the_budget_holds_within_one_batch_of_claims() -> None:
    """A final-only answer's claims all come at once: the budget is checked between them,
    not only before the batch (100 claims at ~0.1 s each took 10 s against a 2 s budget)."""
    session = _one_second_per_call(answer_budget_s=1.5)
    answer = " ".join(f"Claim number {i} is about Frankenstein." for i in range(6))
    results, signal = session.finish(answer)
    assert len(results) == 2  # 0 s spent, then 1 s: two verified, the budget is then gone
    assert session.over_budget == 4 and signal.unchecked == 4


def test_each_check_counts_the_verifier_pairs_it_took(lexical: LexicalVerifier) -> None:
    first = "Metformin activates AMPK in many tissues except liver."
    second = "Metformin acts through AMPK."
    chunks = [EvidenceChunk("a", f"{first} {second}")]
    claim = segment_claims("Metformin activates AMPK in the liver.")
    four = ClaimScorer(KeywordVerifier(), max_chars=60, max_windows=4)
    (windowed,) = four.check(claim, four.index(chunks), "q?")
    assert windowed.pairs == 2  # two windows of at most 60 characters
    one = ClaimScorer(lexical)
    (single,) = one.check(claim, one.index(chunks), "q?")
    both = ClaimScorer(lexical, best_chunk=True, max_sentences=1)
    (two,) = both.check(claim, both.index(chunks), "q?")
    (none,) = one.check(claim, one.index([]), "q?")
    assert (single.pairs, two.pairs, none.pairs) == (1, 2, 0)


def _session(
    answer_pairs: int, clock: Callable[[], float], scorer: ClaimScorer | None = None
) -> VerifierClaimSession:
    return VerifierClaimSession(
        scorer or ClaimScorer(LexicalVerifier()),
        [EvidenceChunk("c1", "Mary Shelley wrote Frankenstein. It was published in 1818.")],
        "trusted",
        answer_pairs=answer_pairs,
        clock=clock,
    )


def test_the_answer_budget_counts_verifier_pairs_not_time() -> None:
    """A busy CPU (every verifier call "takes" 10 s) checks an answer exactly as far as a
    quiet one: the same results and signal, so a replay repeats its verdicts. Before, a
    2 s wall-clock budget made the slow session stop after one claim."""
    answer = " ".join(f"Claim number {i} is about Frankenstein." for i in range(6))
    slow_ticks = iter(float(10 * i) for i in range(1000))
    slow = _session(4, lambda: next(slow_ticks))
    quiet = _session(4, lambda: 0.0)
    slow_out, quiet_out = slow.finish(answer), quiet.finish(answer)
    assert slow_out == quiet_out
    results, signal = quiet_out
    assert len(results) == 4 and signal.unchecked == 2  # one pair per claim, four pairs
    assert quiet.pairs_spent == 4 and quiet.over_budget == 2


def test_a_claim_is_verified_while_pairs_are_left_and_costs_all_its_windows() -> None:
    text = "Metformin activates AMPK in many tissues except liver. Metformin acts through AMPK."
    scorer = ClaimScorer(KeywordVerifier(), max_chars=60, max_windows=4)
    session = VerifierClaimSession(scorer, [EvidenceChunk("a", text)], "trusted", answer_pairs=3)
    answer = " ".join(["Metformin activates AMPK in the liver."] * 3)
    results, signal = session.finish(answer)
    # 0 pairs spent, then 2 (< 3): two claims verified (4 pairs), the third is unchecked
    assert len(results) == 2 and session.pairs_spent == 4 and signal.unchecked == 1


@pytest.mark.parametrize("pairs", [0, -1])
def test_the_pair_budget_must_be_positive(pairs: int, lexical: LexicalVerifier) -> None:
    with pytest.raises(ValueError, match="answer_pairs must be >= 1"):
        VerifierClaimChecker(ClaimScorer(lexical), answer_pairs=pairs)
