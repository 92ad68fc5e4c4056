"""Word folding for the lexical matchers: accents do not cut a Latin word in pieces."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from sidecar.claims.calibration import coverage
from sidecar.claims.evidence import content_terms
from sidecar.confidence.features import missing_terms
from sidecar.words import fold


@given(st.text(alphabet=string.printable))
def test_ascii_text_is_only_lower_cased(text: str) -> None:
    assert fold(text) == text.lower()


def test_accented_latin_letters_fold_to_their_base_letters() -> None:
    assert fold("Zürich, KØBENHAVN, Straße, São Paulo, Łódź, Ærø, Þingvellir") == (
        "zurich, kobenhavn, strasse, sao paulo, lodz, aero, thingvellir"
    )
    # already decomposed input (a combining diaeresis after the u) reads the same
    assert fold("Zu\u0308rich") == "zurich"


def test_ligatures_of_text_taken_from_pdfs_are_spelled_out() -> None:
    # before: "ﬁrm proﬁt ﬂowed" gave the terms ['rm', 'pro', 'owed']
    assert fold("ﬁrm proﬁt ﬂowed, ﬀ ﬃ ﬄ ﬅ ﬆ") == "firm profit flowed, ff ffi ffl st st"
    assert content_terms("The ﬁrm's proﬁt ﬂowed") == content_terms("The firm's profit flowed")
    assert coverage("The firm reported a profit.", "The ﬁrm reported a proﬁt.") == 1.0
    assert missing_terms("firm profit flowed", ["The ﬁrm's proﬁt ﬂowed offshore"]) == []


def test_other_scripts_keep_their_letters() -> None:
    assert fold("Москва 東京") == "москва 東京"


def test_folding_never_grows_a_text_more_than_four_times() -> None:
    # canonical decomposition is bounded; a compatibility one turns U+FDFA into 18 letters
    hostile = "\ufdfa\u0390\u1fb7\u01d5" * 1000
    assert len(fold(hostile)) <= 4 * len(hostile)


def test_content_terms_keep_an_accented_word_whole() -> None:
    # before: ['rich', 'benhavn', 'stra', 'paulo'] (the accents cut the words)
    assert content_terms("Zürich, København, Straße and São Paulo") == [
        "zurich",
        "kobenhavn",
        "strasse",
        "sao",
        "paulo",
    ]


def test_a_claim_meets_its_evidence_with_or_without_accents() -> None:
    # before: 0.5 ("Zürich" gave "rich", which "Zurich" does not hold)
    claim = "The ETH is in Zürich."
    assert coverage(claim, "ETH Zurich is a university in Zurich, Switzerland.") == 1.0
    assert coverage("The ETH is in Zurich.", "ETH Zürich is a university in Zürich.") == 1.0


def test_the_reformulation_hint_does_not_name_a_word_fragment() -> None:
    # before: ['river', 'rich']
    chunks = ["The Limmat flows through Zurich. Sao Paulo has the Tiete."]
    assert missing_terms("Which river flows through Zürich and São Paulo", chunks) == ["river"]
    # the German chunk names Zürich, and nothing else the question asks
    german = ["Die Limmat fließt durch Zürich"]
    assert "zurich" not in missing_terms("Which river flows through Zurich", german)
