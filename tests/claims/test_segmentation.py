"""Streaming sentence and claim segmentation (seed 001 Step 1, seed 002 claim extraction)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.claims.segment import ClaimSegmenter, segment_claims
from sidecar.claims.sentences import SentenceSplitter, split_sentences

TEXTS = [
    "Dr. Smith moved to the U.S. He was born in 1970. Pi is 3.14 and e is 2.718. "
    "See e.g. the report.",
    "The main points are:\n1. Metformin activates AMPK.\n2. It reduces HbA1c by 1.5%.\n"
    "- Dosing is 500mg twice daily\n- Avoid it if eGFR < 30",
    "Is this right? I think so! The U.S. Army was founded in 1775. J. K. Rowling wrote it.",
    'Apple Inc. makes phones. The company grew fast... He said "no." Then he left.',
    "Aspirin reduces fever by inhibiting COX enzymes and is effective for mild pain. "
    "The recommended adult dose is 325-650mg every 4-6 hours, and it should not be given "
    "to children under 12.",
    "Paris is in France。巴黎在法国！东京呢？「东京在日本。」Berlin is in Germany. "  # noqa: RUF001 - CJK on purpose
    "पेरिस फ्रांस में है। Rome is in Italy؟ 3.14 is pi。",
]


def _stream_sentences(text: str, cuts: list[int]) -> list[tuple[int, int, str, str]]:
    splitter = SentenceSplitter()
    out = []
    last = 0
    for cut in [*sorted(cuts), len(text)]:
        out += splitter.feed(text[last:cut])
        last = cut
    out += splitter.finish()
    return [(s.start, s.end, s.text, s.kind) for s in out]


@pytest.mark.parametrize("text", TEXTS)
def test_any_cut_into_deltas_gives_the_same_sentences(text: str) -> None:
    whole = [(s.start, s.end, s.text, s.kind) for s in split_sentences(text)]
    rng = random.Random(7)
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 25))))
        assert _stream_sentences(text, cuts) == whole
    # one character at a time: every word is split across deltas
    assert _stream_sentences(text, list(range(1, len(text)))) == whole


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(TEXTS),
    st.lists(st.integers(min_value=1, max_value=400), max_size=30),
)
def test_claims_do_not_depend_on_delta_boundaries(text: str, raw_cuts: list[int]) -> None:
    cuts = sorted({c for c in raw_cuts if c < len(text)})
    seg = ClaimSegmenter()
    streamed = []
    last = 0
    for cut in [*cuts, len(text)]:
        streamed += seg.feed(text[last:cut])
        last = cut
    streamed += seg.finish(text)
    assert streamed == segment_claims(text)
    assert [c.index for c in streamed] == list(range(len(streamed)))


def test_abbreviations_decimals_and_lists() -> None:
    sentences = [s.text for s in split_sentences(TEXTS[0])]
    assert sentences == [
        "Dr. Smith moved to the U.S.",
        "He was born in 1970.",
        "Pi is 3.14 and e is 2.718.",
        "See e.g. the report.",
    ]
    items = split_sentences(TEXTS[1])
    assert [(s.kind, s.text) for s in items] == [
        ("heading", "The main points are:"),
        ("list-item", "Metformin activates AMPK."),
        ("list-item", "It reduces HbA1c by 1.5%."),
        ("list-item", "Dosing is 500mg twice daily"),
        ("list-item", "Avoid it if eGFR < 30"),
    ]
    third = [s.text for s in split_sentences(TEXTS[2])]
    assert "The U.S. Army was founded in 1775." in third
    assert "J. K. Rowling wrote it." in third


def test_a_sentence_completes_only_when_whitespace_follows_its_terminator() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("It was 18") == []
    assert splitter.feed("18.") == []  # could still be "1818.5"
    assert splitter.feed("5 metres") == []
    [done] = splitter.feed(". Next")
    assert done.text == "It was 1818.5 metres."
    assert splitter.finish()[0].text == "Next"


def test_an_ambiguous_abbreviation_waits_for_the_next_word() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("He moved to the U.S. Th") == []  # "The" (new sentence) or "Thames"?
    done = splitter.feed("e rest followed. ")
    assert [s.text for s in done] == ["He moved to the U.S.", "The rest followed."]
    other = SentenceSplitter()
    assert other.feed("He joined the U.S. Army in 1990. ")[0].text == (
        "He joined the U.S. Army in 1990."
    )


def test_spans_point_into_the_answer() -> None:
    answer = TEXTS[4] + "\n- Is it safe? Probably.\n3. Paris is the capital of France."
    claims = segment_claims(answer)
    assert claims
    for claim in claims:
        own = answer[claim.span[0] : claim.span[1]]
        assert own.strip() and own == own.strip()
        # the claim's own words (capitalised, maybe after a copied subject)
        assert own.rstrip(".").lower() in claim.text.lower()
        s0, s1 = claim.sentence
        assert s0 <= claim.span[0] < claim.span[1] <= s1


def test_coordinated_clauses_are_split_and_the_subject_is_carried() -> None:
    claims = [c.text for c in segment_claims(TEXTS[4])]
    assert claims == [
        "Aspirin reduces fever by inhibiting COX enzymes.",
        "Aspirin is effective for mild pain.",
        "The recommended adult dose is 325-650mg every 4-6 hours.",
        "It should not be given to children under 12.",
    ]


def test_numbers_dates_and_name_lists_stay_in_one_claim() -> None:
    texts = [c.text for c in segment_claims(
        "Smith, Jones, and Brown won the prize in 2001. The treaty was signed on June 28, 1919. "
        "Between 3 and 5 people attended."
    )]  # fmt: skip
    assert texts == [
        "Smith, Jones, and Brown won the prize in 2001.",
        "The treaty was signed on June 28, 1919.",
        "Between 3 and 5 people attended.",
    ]


def test_questions_evaluations_and_pleasantries_are_dropped_hedged_claims_are_kept() -> None:
    answer = (
        "Sure! Is the drug safe? I think it is great. In my opinion, it works. "
        "This is amazing. Based on the context, the drug was approved in 2019. "
        "I hope this helps. Let me know if you need more."
    )
    claims = segment_claims(answer)
    # "In my opinion, it works." is a hedged claim of "it works": verified, not dropped
    assert [c.text for c in claims] == ["It works.", "The drug was approved in 2019."]
    assert answer[claims[1].span[0] : claims[1].span[1]] == "the drug was approved in 2019."


def test_semicolons_split_independent_clauses() -> None:
    texts = [c.text for c in segment_claims("Paris is in France; Berlin is in Germany.")]
    assert texts == ["Paris is in France.", "Berlin is in Germany."]


def test_a_final_answer_that_differs_from_the_stream_is_finished_from_the_last_sentence() -> None:
    seg = ClaimSegmenter()
    first = seg.feed("Paris is the capital of France. Lyon is ")
    assert [c.text for c in first] == ["Paris is the capital of France."]
    tail = seg.finish("Paris is the capital of France. Lyon has a large old town.")
    assert seg.mismatch
    assert [c.text for c in tail] == ["Lyon has a large old town."]
    assert tail[0].index == 1
