"""The rule tier for numbers and dates, and the seeds' scores against hand-computed values."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.claims import rules
from sidecar.claims.rules import check_quantities, extract_quantities
from sidecar.claims.scores import (
    ClaimCounts,
    hallucination_rate,
    reliability,
    reliability_level,
    summarise,
)
from sidecar.contracts.events import ClaimLabel, SignalStatus

# Seed 001's worked example (metformin): the context and the five claims.
CONTEXT = (
    "Metformin reduces hepatic glucose production by activating AMPK. In clinical trials, "
    "first-line metformin therapy reduces HbA1c by approximately 1.5%. It is generally "
    "well-tolerated with the most common side effects being GI upset."
)


@pytest.mark.parametrize(
    ("claim", "contradicted"),
    [
        ("Metformin works by activating AMPK to reduce hepatic glucose output.", False),
        ("It typically reduces HbA1c by 1.5%.", False),
        ("The standard starting dose is 500mg twice daily.", True),
        ("Maximum dose is 2000mg/day.", True),
        ("Should be avoided in patients with eGFR < 30.", True),
        ("It reduces HbA1c by 1.7%.", True),
    ],
)
def test_seed001_example_numbers(claim: str, contradicted: bool) -> None:
    assert check_quantities(claim, CONTEXT).contradicted is contradicted


def test_no_quantity_means_no_rule() -> None:
    check = check_quantities("Metformin activates AMPK.", CONTEXT)
    assert not check.applies and not check.contradicted


def test_seed002_treaty_figure_and_ratification_year() -> None:
    context = "The Treaty of Versailles was signed on June 28, 1919."
    assert not check_quantities("The treaty was signed on 28 June 1919.", context).contradicted
    bad = check_quantities("It imposed reparations of $442 billion, ratified in 1920.", context)
    assert [q.surface for q in bad.missing] == ["442 billion", "1920"]
    assert check_quantities("It was signed in July 1919.", context).describe() == (
        "not in the evidence: July"
    )


def test_scales_separators_words_and_rounding() -> None:
    assert not check_quantities("about 1.5 million people", "1,523,000 people").contradicted
    assert check_quantities("about 1.7 million people", "1,523,000 people").contradicted
    assert not check_quantities("three acts", "an opera in 3 acts").contradicted
    assert not check_quantities("10,000 copies", "10000 copies were sold").contradicted
    assert check_quantities("325-650mg", "325mg").contradicted  # 650 is missing


def test_identifier_digits_and_may_the_verb_are_not_quantities() -> None:
    surfaces = [q.surface for q in extract_quantities("HbA1c may fall; it may drop in May 2020")]
    assert surfaces == ["May", "2020"]


# ------------------------------------------------------------------ seed scores


def counts(s: int = 0, u: int = 0, c: int = 0, i: int = 0) -> ClaimCounts:
    return ClaimCounts(supported=s, unsupported=u, uncertain=c, irrelevant=i)


@pytest.mark.parametrize(
    ("c", "rel", "level", "rate"),
    [
        (counts(s=2, u=3), 0.40, "LOW", 0.6),  # seed 001 worked example: 2/5 -> LOW
        (counts(s=17, u=3), 0.85, "HIGH", 0.15),  # exactly on the HIGH threshold
        (counts(s=13, u=7), 0.65, "MEDIUM", 0.35),  # exactly on the MEDIUM threshold
        (counts(s=6, c=2), 0.875, "HIGH", 0.0),  # (6 + 0.5*2)/8
        (counts(s=3, u=1, c=1), 0.70, "MEDIUM", 0.2),  # (3 + 0.5)/5
        (counts(s=4, u=1, i=1), 0.80, "MEDIUM", 0.2),  # seed 002: irrelevant left out
        (counts(i=3), 1.0, "HIGH", 0.0),  # only irrelevant claims: seed 002 rate 0.0
        (counts(), 1.0, "HIGH", 0.0),  # seed 001: no claims -> 1.0 / HIGH
        (counts(u=1, c=1), 0.25, "LOW", 0.5),
    ],
)
def test_reliability_and_hallucination_rate(
    c: ClaimCounts, rel: float, level: str, rate: float
) -> None:
    assert reliability(c) == pytest.approx(rel)
    assert reliability_level(c) == level
    assert hallucination_rate(c) == pytest.approx(rate)


def test_summarise_fills_the_claims_signal() -> None:
    labels = [ClaimLabel.SUPPORTED] * 2 + [ClaimLabel.UNSUPPORTED] * 3
    sig = summarise(labels, "trusted")
    assert sig.status is SignalStatus.OK
    assert (sig.n, sig.supported, sig.unsupported, sig.uncertain, sig.irrelevant) == (5, 2, 3, 0, 0)
    assert sig.reliability == pytest.approx(0.4) and sig.reliability_level == "LOW"
    assert sig.hallucination_rate == pytest.approx(0.6)
    assert sig.evidence_scope == "trusted"


@pytest.mark.parametrize(
    ("text", "surfaces"),
    [
        ("Have you seen that one?", []),
        ("One of the best films of 1959", ["1959"]),
        ("No one came on May one", []),  # neither "one" nor the month beside it
        ("He won one Oscar and two Emmys", ["two"]),
        ("twenty-one guns, one hundred men", ["twenty-one", "one hundred"]),
        ("one, two", ["one", "two"]),  # "one" beside another number word
    ],
)
def test_one_is_a_quantity_only_next_to_another_number(text: str, surfaces: list[str]) -> None:
    assert [q.surface for q in extract_quantities(text)] == surfaces


def test_a_pronoun_one_does_not_cap_a_claim_the_evidence_states() -> None:
    evidence = "Veronica Cartwright starred in Invasion of the Body Snatchers."
    claim = "She also starred in Invasion of the Body Snatchers. Have you seen that one?"
    assert not check_quantities(claim, evidence).applies
    assert check_quantities("She starred in two of them.", evidence).contradicted


def test_a_claim_figure_matches_the_word_one_in_the_evidence() -> None:
    assert not check_quantities("He won 1 Oscar.", "He won one Oscar.").contradicted
    assert check_quantities("He won 2 Oscars.", "He won one Oscar.").contradicted
    assert [q.surface for q in extract_quantities("that one", evidence=True)] == ["one"]


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["one", "One", "that", "twenty", "1", "May", "x", "hundred", "-"]),
        max_size=30,
    ),
    seps=st.lists(st.sampled_from(["", " ", "  ", "   ", ", "]), min_size=30, max_size=30),
)
def test_a_claim_keeps_a_one_only_beside_a_number_and_the_evidence_keeps_every_one(
    words: list[str], seps: list[str]
) -> None:
    """The evidence side reads a superset of the claim side (an extra evidence value can
    only let a claim value match), and they differ only by lone "one"s (and an ambiguous
    month beside one); a "one" with no other number within 3 characters is never the
    claim's."""
    text = "".join(w + s for w, s in zip(words, seps, strict=False))
    claim = [(q.surface, q.value, q.month) for q in extract_quantities(text)]
    evidence = [(q.surface, q.value, q.month) for q in extract_quantities(text, evidence=True)]
    assert all(claim.count(q) <= evidence.count(q) for q in claim)
    extra = [q for q in set(evidence) if evidence.count(q) > claim.count(q)]
    assert all(q[0].lower() == "one" or q[2] is not None for q in extra)  # or a month beside it
    spans = [m.span() for m in rules._NUMBER.finditer(text)]
    spans += [m.span() for m in rules._NUMBER_WORD.finditer(text)]
    lone = sum(
        1
        for m in rules._NUMBER_WORD.finditer(text)
        if m.group(1).lower() == "one"
        and not any(
            (s, e) != m.span() and (0 <= m.start() - e <= 3 or 0 <= s - m.end() <= 3)
            for s, e in spans
        )
    )
    ones = sum(1 for q in claim if q[0].lower() == "one")
    assert ones <= sum(1 for q in evidence if q[0].lower() == "one") - lone


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["May", "march", "Jan", "June", "1", "12", "1999", "two", "x", " ", "-"]),
        max_size=40,
    ),
    seps=st.lists(st.sampled_from(["", " ", "  ", "   ", ", "]), min_size=40, max_size=40),
)
def test_ambiguous_months_count_exactly_when_a_number_is_within_two_characters(
    words: list[str], seps: list[str]
) -> None:
    """The set lookup keeps the rule the linear scan had (a number ending <= 2 characters
    before the month or starting <= 2 after it), without its cost in long evidence."""
    text = "".join(w + s for w, s in zip(words, seps, strict=False))
    spans = [m.span() for m in rules._NUMBER.finditer(text)]
    spans += [m.span() for m in rules._NUMBER_WORD.finditer(text)]
    kept = []
    for m in rules._MONTH.finditer(text):
        near = any(0 <= m.start() - e <= 2 or 0 <= s - m.end() <= 2 for s, e in spans)
        if m.group(1).lower() not in rules._AMBIGUOUS_MONTHS or near:
            kept.append(m.group(1))
    assert [q.surface for q in extract_quantities(text) if q.month is not None] == kept


@pytest.mark.parametrize(
    ("claim", "evidence", "contradicted"),
    [
        # the evidence's "May of 2018" is the month (audit: a right summary's "May 1")
        ("It hits theaters May 1.", "Parts 1 and 2, due in May of 2018.", False),
        ("It hits theaters May 1.", "Parts 1 and 2, due in June of 2018.", True),
        ("It hits theaters May 1.", "You may of 2 minds, Part 1.", True),  # the verb
        ("It hits theaters May 1.", "Part 1, in May of course.", True),  # no number after
        # a claim's "May of 2018" is not read as the month: only 2018 is checked
        ("The May of 2018 release.", "It was released in 2018.", False),
    ],
)
def test_the_evidence_reads_a_month_before_of_and_a_number(
    claim: str, evidence: str, contradicted: bool
) -> None:
    assert check_quantities(claim, evidence).contradicted is contradicted


@pytest.mark.parametrize(
    ("claim", "evidence", "contradicted"),
    [
        ("It was worth just £15.4m.", "the £15.4million estate", False),
        ("It was worth just £15.4m.", "the £16.4million estate", True),
        ("A $2.5m starting price.", "a starting price of $2.5 million", False),
        ("A $64k salary.", "paid 64,000 dollars a year", False),
        ("A $64k salary.", "paid 64 dollars a year", True),  # k is a thousand, not nothing
        ("Chelsea signed a £200m deal.", "a £200million sponsorship deal", False),
        ("A €3B fund.", "a fund of 3 billion euros", False),
        ("A 5m drop.", "a 5 million drop", True),  # without a currency sign m may be metres
        ("A 5m drop.", "a 5m drop", False),
        # a range with one scale gives it to both ends
        ("Worth $5-10m.", "worth from $5m to $10m", False),
        ("Worth $5-10m.", "worth from $5 to $10", True),
        ("5-10 million people", "between 5 million and 10 million people", False),
        ("325-650mg", "325mg to 650mg", False),  # mg is no scale: the ends stay 325 and 650
        ("A 5-10m drop.", "a 5 to 10 million drop", True),  # no sign: metres, maybe
        # ... said with "to", or "between ... and" (both ends were read 5 and 10 million)
        ("5 to 10 million people", "between 5 million and 10 million people", False),
        ("Between 5 and 10 million people.", "5 million to 10 million people", False),
        ("From $5 to $10 billion.", "from $5 billion to $10 billion", False),
        ("Between £5 and £10m.", "£5m to £10m", False),
        ("Between 5 and 10 people.", "5 million and 10 million people", True),  # no scale
        ("He scored 5 and 10 million watched.", "5 goals; 10 million viewers", False),
    ],
)
def test_money_short_scales_after_a_currency_sign(
    claim: str, evidence: str, contradicted: bool
) -> None:
    assert check_quantities(claim, evidence).contradicted is contradicted


@pytest.mark.parametrize(
    ("claim", "evidence", "contradicted"),
    [
        ("It sold 1 million copies.", "it sold a million copies", False),
        ("It sold one thousand copies.", "it sold a thousand copies", False),
        ("It sold 2 million copies.", "it sold a million copies", True),
        ("A millionaire bought it for 1 million.", "a millionaire bought it", True),
    ],
)
def test_the_evidence_reads_a_million_as_one_million(
    claim: str, evidence: str, contradicted: bool
) -> None:
    assert check_quantities(claim, evidence).contradicted is contradicted
    assert not extract_quantities("a million reasons")  # the claim side reads no number


@pytest.mark.parametrize(
    ("claim", "evidence", "contradicted"),
    [
        ("The show starts at 7:30pm.", "It starts at 7.30pm.", False),
        ("The show starts at 7.30 p.m.", "It starts at 7:30 pm.", False),
        ("Tiger Woods tees off at 3.30pm.", "Group 15, 3:30pm: Tiger Woods", False),
        ("The show starts at 7.30pm.", "It starts at 7:45pm.", True),
        ("The show starts at 7.30pm.", "It starts at 7.3pm.", True),  # 30 minutes, not 0.3
        ("It fell 7.30 per cent.", "it fell 7.3%", False),  # no clock: a decimal
    ],
)
def test_a_time_with_a_dot_is_hours_and_minutes(
    claim: str, evidence: str, contradicted: bool
) -> None:
    assert check_quantities(claim, evidence).contradicted is contradicted


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(
        st.sampled_from(
            ["1", "1,000", "1,000.30", "7.30", "24", ".", ".30", ",", "$", "£", "pm", "a.m.", "am",
             "-", "to", "and", "between", "a", "million", "m", "k", "third", "twenty", "May"]
        ),
        max_size=25,
    ),
    seps=st.lists(st.sampled_from(["", " "]), min_size=25, max_size=25),
)  # fmt: skip
@example(tokens=["at", "1,000.30", "pm"], seps=[" ", "", ""] + [""] * 22)
def test_reading_figures_never_raises(tokens: list[str], seps: list[str]) -> None:
    """Whatever a claim or its evidence holds, the rule reads it (a claim's "1,000.30pm"
    raised ValueError when the time-of-day reading took its digits for hours)."""
    text = "".join(t + s for t, s in zip(tokens, seps, strict=False))
    for evidence in (False, True):
        for q in extract_quantities(text, evidence=evidence):
            assert q.value is None or q.value >= 0


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("at 1,000.30pm", [1000.3]),  # no hour: a decimal (int("1,000") raised ValueError)
        ("costs $7.30 pm", [7.3]),  # money
        ("at 25.30pm", [25.3]),
        ("at 7.60pm", [7.6]),
        ("at 23.59 pm", [23.0, 59.0]),
    ],
)
def test_what_is_no_time_of_day_stays_a_decimal(text: str, read: list[float]) -> None:
    assert [q.value for q in extract_quantities(text)] == read
    assert [q.value for q in extract_quantities(text, evidence=True)] == read


@pytest.mark.parametrize(
    ("claim", "evidence", "contradicted"),
    [
        ("It ran for twenty-five years.", "It ran for 25 years.", False),
        ("It ran for 25 years.", "It ran for twenty-five years.", False),
        ("It ran for twenty-six years.", "It ran for 25 years.", True),
        ("About two hundred people came.", "200 people came", False),
        ("Three thousand copies.", "3,000 copies", False),
        ("Five million viewers.", "5 million viewers", False),
        ("5 million viewers.", "five million viewers", False),
        ("Six million viewers.", "5 million viewers", True),
        ("Founded in two thousand and nine.", "founded in 2009", False),
        ("Orwell wrote Nineteen Eighty-Four.", "his novel 1984", False),
        ("Two dozen eggs.", "24 eggs", False),
        ("It takes two or three hours.", "2 to 3 hours", False),  # no run across "or"
        ("Between two and three hours.", "2 to 3 hours", False),  # "and" only after hundred
    ],
)
def test_number_words_in_a_row_make_one_number(
    claim: str, evidence: str, contradicted: bool
) -> None:
    assert check_quantities(claim, evidence).contradicted is contradicted


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("one hundred and five", [105.0]),
        ("five hundred thousand", [500_000.0]),
        ("one million two hundred thousand", [1_200_000.0]),
        ("twenty twenty-one", [2021.0]),
        ("five six", [5.0, 6.0]),  # no number together: each word as before
        ("ages ten-twelve", [10.0, 12.0]),  # a range, not the year 1012
        ("in nineteen twelve", [1912.0]),
        ("millions of fans", []),  # a scale word alone is no number
        ("one one one one one one", [1.0] * 6),  # long runs that are no number: linear
    ],
)
def test_number_word_runs_read_as_written(text: str, values: list[float]) -> None:
    assert [q.value for q in extract_quantities(text, evidence=True)] == values


@pytest.mark.parametrize(
    ("claim", "evidence", "contradicted"),
    [
        ("Its 3rd season aired in May.", "Its third season aired in May.", False),
        ("Its 4th season aired in May.", "Its third season aired in May.", True),
        ("The 21st century.", "The twenty-first century.", False),
        ("He was the first to do it.", "He pioneered it.", False),  # the claim's "first": none
        ("He scored 2 goals.", "He scored in the second half.", False),
        ("He scored 2 goals.", "He scored 30 seconds into a 30 second spell.", True),
        ("He scored 2 goals.", "He scored in a split second.", True),  # time, not 2nd
        ("He scored 2 goals.", "He ran 9 metres per second.", True),
        ("On the 22nd day.", "on the twenty-second day", False),
    ],
)
def test_the_evidence_reads_ordinal_words(claim: str, evidence: str, contradicted: bool) -> None:
    assert check_quantities(claim, evidence).contradicted is contradicted
    assert not [q for q in extract_quantities("the first and the third") if q.value]


def test_two_years_glued_in_the_evidence_are_both_read() -> None:
    evidence = "The Box was released 20092009 was the year that released Zombieland."
    assert not check_quantities("It was released in 2009.", evidence).contradicted
    assert check_quantities("It was released in 2010.", evidence).contradicted
    glued = "Messenger was released 20042005 was"
    assert [q.surface for q in extract_quantities(glued, evidence=True)] == [
        "20042005", "2004", "2005",
    ]  # fmt: skip
    # the claim side reads the run as written; ids and other runs are not split
    assert [q.surface for q in extract_quantities(glued)] == ["20042005"]
    assert [q.surface for q in extract_quantities("ref 12345678", evidence=True)] == ["12345678"]


def test_a_number_glued_to_the_sentence_before_it_is_read_in_the_evidence() -> None:
    evidence = "It is in the Financial District of Manhattan.55 Hudson Yards is a skyscraper."
    assert not check_quantities("55 Hudson Yards", evidence).contradicted
    assert check_quantities("56 Hudson Yards", evidence).contradicted
    # a decimal is not split ("3.5" stays 3.5) and an identifier stays none ("v1.2")
    assert [q.value for q in extract_quantities("it grew 3.5% in v1.2", evidence=True)] == [3.5]
    assert extract_quantities("Manhattan.55") == []  # the claim side reads only its own
    assert [q.surface for q in extract_quantities("ref 20092009.5", evidence=True)] == [
        "20092009.5"
    ]
