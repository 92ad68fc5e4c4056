"""A claim that opens with a pronoun is read with the claims before it; any other, as before."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.claims.checker import VerifierClaimChecker
from sidecar.claims.context import (
    MAX_CONTEXT_CHARS,
    context_of,
    leans_on_context,
    with_context,
)
from sidecar.claims.evidence import EvidenceChunk
from sidecar.claims.scorer import ClaimScorer
from sidecar.claims.segment import segment_claims
from sidecar.contracts.events import RetrievalSignal, SignalStatus
from tests.claims.conftest import LexicalVerifier, RetrievalFactory

SHELLEY = "Frankenstein was written by Mary Shelley. It was first published in 1818."
EVIDENCE = (
    "Frankenstein; or, The Modern Prometheus is an 1818 novel written by English author "
    "Mary Shelley. Gothic fiction is a loosely defined genre of literature."
)
QUESTION = "who wrote the novel frankenstein"


@pytest.mark.parametrize(
    "claim",
    [
        "It was first published in 1818.",
        "It's a Gothic novel.",
        "Its author was English.",
        "He was born in 1970.",
        "His first novel sold well.",
        "She wrote it in 1816.",
        "Her husband was a poet.",
        "They beat Internazionale 2-1.",
        "Their manager was Jock Stein.",
        "This made it famous.",
        "These stairs are for emergencies.",
        "That year the wall fell.",
        "Those films were in colour.",
        "The latter won in 1911.",
        '"It was a success," the paper said.',
    ],
)
def test_a_leading_pronoun_or_demonstrative_leans_on_context(claim: str) -> None:
    assert leans_on_context(claim)


@pytest.mark.parametrize(
    "claim",
    [
        "Frankenstein was written by Mary Shelley.",
        "Italy borders France.",
        "Heat rises.",
        "Thessaloniki is in Greece.",
        "There are 159 counties in Georgia.",
        "The novel was published in 1818.",
        "Mary Shelley wrote it in 1816.",
    ],
)
def test_a_claim_that_names_its_subject_stands_alone(claim: str) -> None:
    assert not leans_on_context(claim)


def test_the_context_reaches_back_to_the_nearest_claim_that_stands_alone() -> None:
    assert context_of([]) == ""
    assert context_of(["A was first.", "B was second."]) == "B was second."
    assert context_of(["A was first.", "It was second."]) == "A was first. It was second."
    # at most MAX_CONTEXT_CLAIMS (2) claims, even when both lean on context
    assert context_of(["A.", "It was b.", "It was c."]) == "It was b. It was c."


def test_a_long_context_keeps_its_nearest_words() -> None:
    words = " ".join(f"word{k}" for k in range(200))
    context = context_of([words + "."])
    assert len(context) <= MAX_CONTEXT_CHARS
    assert (words + ".").endswith(context)
    assert context.startswith("word") and f" {context}" in f" {words}."  # whole words


def test_the_question_comes_first_then_the_context() -> None:
    assert with_context("q", "") == "q"
    assert with_context("", "ctx") == "ctx"
    assert with_context("who wrote it", "Mary Shelley wrote it.") == (
        "who wrote it Mary Shelley wrote it."
    )


def test_the_segmenter_gives_a_pronoun_claim_the_claim_before_it() -> None:
    first, second = segment_claims(SHELLEY)
    assert first.context == ""
    assert second.context == "Frankenstein was written by Mary Shelley."
    # a clause of the same sentence counts, and a claim that opens an answer has nothing
    lone, after = segment_claims("It is an 1818 novel, and it was written by Mary Shelley.")
    assert lone.context == "" and after.context == "It is an 1818 novel."


_SENTENCES = st.sampled_from(
    [
        "Frankenstein was written by Mary Shelley.",
        "It was first published in 1818.",
        "She was born in London.",
        "The novel is about a scientist.",
        "Its subtitle is The Modern Prometheus.",
        "Hoover defeated Al Smith, and he won 40 states.",
        "These results were final.",
        "Celtic won the cup in 1967.",
    ]
)


@settings(max_examples=80, deadline=None)
@given(st.lists(_SENTENCES, min_size=1, max_size=8))
def test_only_a_claim_that_leans_on_context_gets_one(sentences: list[str]) -> None:
    claims = segment_claims(" ".join(sentences))
    for k, claim in enumerate(claims):
        if leans_on_context(claim.text) and k > 0:
            assert claim.context == context_of([c.text for c in claims[:k]])
            assert claim.context.endswith(claims[k - 1].text)
        else:
            assert claim.context == ""


def _certified() -> RetrievalSignal:
    return RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=["c0"], m1=True, m2=0.5)


@pytest.mark.parametrize("max_windows", [1, 3])
def test_a_claim_without_context_reaches_the_verifier_exactly_as_before(
    max_windows: int, lexical: LexicalVerifier
) -> None:
    """Its pairs and question are those of the claim scored alone with the user's question."""
    scorer = ClaimScorer(lexical, max_windows=max_windows, max_chars=200)
    index = scorer.index([EvidenceChunk("c0", EVIDENCE)])
    claims = segment_claims(SHELLEY + " Mary Shelley was an English novelist.")
    assert [bool(c.context) for c in claims] == [False, True, False]
    together = scorer.check(claims, index, QUESTION)
    calls = list(zip(lexical.calls, lexical.questions, strict=True))
    for k in (0, 2):
        lexical.calls.clear()
        lexical.questions.clear()
        [alone] = scorer.check([claims[k]], index, QUESTION)
        assert alone == together[k]
        assert set(zip(lexical.calls, lexical.questions, strict=True)) <= set(calls)
        assert set(lexical.questions) == {QUESTION}


def test_a_pronoun_claim_is_read_with_the_question_and_its_context(
    lexical: LexicalVerifier,
) -> None:
    scorer = ClaimScorer(lexical)
    index = scorer.index([EvidenceChunk("c0", EVIDENCE)])
    claims = segment_claims(SHELLEY)
    scorer.check(claims, index, QUESTION)
    asked = dict(zip((claim for claim, _ in lexical.calls), lexical.questions, strict=True))
    assert asked[claims[0].text] == QUESTION
    assert asked[claims[1].text] == f"{QUESTION} Frankenstein was written by Mary Shelley."
    # stripping the context gives back the bare question
    lexical.questions.clear()
    scorer.check([replace(claims[1], context="")], index, QUESTION)
    assert lexical.questions == [QUESTION]


def test_a_final_answer_that_changes_the_antecedent_rechecks_the_pronoun_claim(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    """Same sentence, other context: the streamed verdict was about another "It"."""
    session = VerifierClaimChecker(ClaimScorer(lexical)).open(retrieval(EVIDENCE), _certified())
    session.feed(SHELLEY + " ")
    final = "Dracula was written by Bram Stoker. It was first published in 1818."
    tail, signal = session.finish(final)
    assert [(r.index, r.text) for r in tail] == [
        (2, "Dracula was written by Bram Stoker."),
        (3, "It was first published in 1818."),
    ]
    assert signal.stream_mismatch and signal.superseded_claims == [0, 1]
    assert [c.claim.context for c in session.checks] == ["", "Dracula was written by Bram Stoker."]


def test_an_unchanged_final_answer_keeps_the_streamed_pronoun_claim(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    session = VerifierClaimChecker(ClaimScorer(lexical)).open(retrieval(EVIDENCE), _certified())
    streamed = session.feed(SHELLEY + " ")
    tail, signal = session.finish(SHELLEY + " Mary Shelley was English.")
    assert [r.index for r in streamed] == [0, 1] and [r.index for r in tail] == [2]
    assert not signal.superseded_claims
