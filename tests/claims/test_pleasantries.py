"""A pleasantry or a hedge in front of a claim never hides the claim (issue #20, item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.claims.checker import VerifierClaimChecker
from sidecar.claims.scorer import ClaimScorer
from sidecar.claims.segment import segment_claims
from sidecar.contracts.events import (
    Decision,
    GenerationFinal,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.policy.config import load_policy
from sidecar.policy.engine import PolicyEngine
from tests.claims.conftest import REPO, LexicalVerifier, RetrievalFactory

FALSE = "the Eiffel Tower is in Berlin."
CLAIM = "The Eiffel Tower is in Berlin."

# The phrases from the report, then variants: each must still yield the claim.
PREFIXED = [
    f"Certainly, {FALSE}",
    f"Of course, {FALSE}",
    f"Of course {FALSE}",
    f"I think {FALSE}",
    f"Sure, {FALSE}",
    f"Certainly {FALSE}",
    f"I think that {FALSE}",
    f"I believe {FALSE}",
    f"I really think {FALSE}",
    f"I\u2019m fairly certain that {FALSE}",
    f"I'm not sure, but {FALSE}",
    f"In my opinion, {FALSE}",
    f"Personally, I think {FALSE}",
    f"Absolutely - {FALSE}",
    f"Certainly \u2014 {FALSE}",
    f"Great question, {FALSE}",
    f"Thanks for asking, {FALSE}",
    f"Thank you for your question: {FALSE}",
    f"Yes, of course, {FALSE}",
    f"Sure, based on the context, I think {FALSE}",
    f"Hopefully {FALSE}",
    f"CERTAINLY, {FALSE.upper()}",
]


@pytest.mark.parametrize("sentence", PREFIXED)
def test_a_claim_behind_a_pleasantry_or_hedge_is_verified(sentence: str) -> None:
    [claim] = segment_claims(sentence)
    assert claim.text.lower() == CLAIM.lower()
    # the span is the claim's own words, after the prefix
    assert sentence[claim.span[0] : claim.span[1]].lower() == FALSE.lower()


def test_sure_without_punctuation_is_kept_and_checked_with_the_claim() -> None:
    # "Sure" is skipped only before punctuation ("Sure Start centres ..." is a name):
    # without it the whole sentence is the claim, still verified, never dropped
    [claim] = segment_claims(f"Sure {FALSE}")
    assert claim.text == f"Sure {FALSE}"


@pytest.mark.parametrize(
    "answer",
    [f"Sure! {CLAIM}", f"Great question! {CLAIM}", f"Of course. {CLAIM} I hope this helps."],
)
def test_a_pleasantry_sentence_before_a_claim_does_not_take_it_along(answer: str) -> None:
    assert [c.text for c in segment_claims(answer)] == [CLAIM]


@pytest.mark.parametrize(
    "sentence",
    [
        "Thanks to its port, Marseille became the richest city of Provence.",
        "No one knows who built the first bridge.",
        "Well water in the region is safe to drink.",
        "Surely Ltd. was founded in 1901.",
        "Sure Start centres opened in 1999 across England.",
    ],
)
def test_words_that_only_look_like_pleasantries_keep_the_whole_sentence(sentence: str) -> None:
    claims = segment_claims(sentence)
    assert claims, sentence
    assert claims[0].span[0] == 0 or sentence.startswith(("Sure ", "Surely "))
    assert claims[-1].span[1] == len(sentence)


def test_thanks_to_is_a_cause_not_a_pleasantry() -> None:
    sentence = "Thanks to the treaty, France gained Alsace in 1919."
    [claim] = segment_claims(sentence)
    assert claim.text == sentence and claim.span == (0, len(sentence))


@pytest.mark.parametrize(
    "text",
    [
        "Sure!",
        "Sure.",
        "Of course.",
        "Certainly!",
        "Certainly not.",
        "Absolutely.",
        "I hope this helps.",
        "Hope that helps!",
        "I hope this information is helpful.",
        "Thank you.",
        "Thanks!",
        "Thanks for asking!",
        "Great question!",
        "Let me know if you need anything else.",
        "Please let me know if you have more questions.",
        "Feel free to ask more questions.",
        "Don't hesitate to reach out.",
        "I'm happy to help.",
        "I\u2019d be glad to help with anything else.",
        "You're welcome!",
        "I think so.",
        "I'm not sure.",
        "I don't know.",
        "Good luck with your project!",
        "Please consult your doctor before changing the dose.",
        "Here is the answer.",
        "Sure, I hope this helps!",
        "Of course, let me know if you need more.",
        "I think it is great.",
        "This is really interesting!",
        "Sure! Of course. I hope this helps. Have a nice day!",
    ],
)
def test_a_sentence_with_nothing_checkable_yields_no_claim(text: str) -> None:
    assert segment_claims(text) == []


def test_a_closing_formula_with_a_claim_spliced_in_is_still_checked() -> None:
    # a formula ends at a clause break: what follows is not part of the formula
    claims = segment_claims("Let me know if you need more, the Eiffel Tower is in Berlin.")
    assert claims and "Berlin" in claims[-1].text


def test_the_reported_bypass_is_caught_under_the_general_profile(
    lexical: LexicalVerifier, retrieval: RetrievalFactory
) -> None:
    """A false answer behind "Certainly," got zero claims and ``allow``; now it is checked."""
    answer = "Certainly, the Eiffel Tower is in Berlin. Of course, it was built in 1899."
    evidence = "The Eiffel Tower is a wrought-iron tower in Paris. It was completed in 1889."
    certification = RetrievalSignal(
        status=SignalStatus.OK, trusted_chunk_ids=["c0"], m1=True, m2=1.0
    )
    session = VerifierClaimChecker(ClaimScorer(lexical)).open(retrieval(evidence), certification)
    streamed = session.feed(answer)
    tail, signal = session.finish(answer)
    assert [r.text for r in [*streamed, *tail]] == [
        "The Eiffel Tower is in Berlin.",
        "It was built in 1899.",
    ]
    assert signal.n == 2 and signal.unsupported >= 1  # 1899 is not in the evidence
    general = load_policy(Path(REPO / "models" / "policy" / "default.yaml")).model_copy(
        update={"default_profile": "general"}
    )
    outcome = PolicyEngine(general).decide(
        retrieval(evidence),
        GenerationFinal(request_id="req-1", answer=answer, generator_model="gen"),
        Signals(retrieval=certification, claims=signal),
        claims=session.results,
    )
    assert outcome.decision is not Decision.ALLOW
    assert "claims-none" not in [r.code for r in outcome.reasons]
