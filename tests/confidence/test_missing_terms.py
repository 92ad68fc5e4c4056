"""``missing_terms`` looks for the query's words without splitting the chunks; it must
answer exactly what splitting every chunk into its words answers."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.confidence import features
from sidecar.confidence.features import missing_terms
from sidecar.words import fold

_WORDS = re.compile(r"[a-z0-9]+")
_STOP = {"the", "and", "was", "who", "for"}


def split_reference(query: str, texts: list[str], limit: int = 5) -> list[str]:
    """The definition: content words of the query that are no chunk's word, both read
    folded ("İ000" folds to "i000", one word; lower-casing alone gives "i\u0307000")."""
    seen = {w for t in texts for w in _WORDS.findall(fold(t))}
    out: list[str] = []
    for word in _WORDS.findall(fold(query)):
        if len(word) > 2 and word not in _STOP and word not in seen and word not in out:
            out.append(word)
    return out[:limit]


# few letters, so query words often sit inside longer chunk words ("cat" in "scat"),
# plus characters whose lowercase is not ASCII and word runs longer than the probe limit
_TEXT = st.text(alphabet="act019 -.\n\u0130\u212aK", max_size=40) | st.sampled_from(
    ["cat " + "scat " * 40, "catcat" * 30 + " cat", "c\u0130at cat"]
)


@settings(max_examples=2_000, deadline=None)
@given(
    query=st.text(alphabet="act019 .", max_size=30),
    texts=st.lists(_TEXT, max_size=4),
    limit=st.integers(0, 6),
)
def test_missing_terms_equals_splitting_every_chunk(
    query: str, texts: list[str], limit: int
) -> None:
    assert missing_terms(query, texts, limit) == split_reference(query, texts, limit)
    with pytest.MonkeyPatch.context() as patch:  # the other way: every chunk split at once
        patch.setattr(features, "_SCAN_BUDGET", 0)
        assert missing_terms(query, texts, limit) == split_reference(query, texts, limit)


def test_a_word_inside_longer_words_only_is_missing() -> None:
    texts = ["scatter scat " * 50, "concatenate"]
    assert missing_terms("cat scat", texts) == ["cat"]
    assert missing_terms("cat scat", [*texts, "a cat."]) == []


def test_many_query_words_over_long_chunks_split_them_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hostile retrieval: 5,000 query words, every one in the last of ~1 MB of chunks.
    Searched once per word it took 3.6 s on the processor thread (every other request
    waited); the chunks are now split into words once."""
    words = ["".join(t) for t in itertools.product("bdfgjkm", repeat=5)][:5_000]
    query = " ".join(words)
    texts = ["z" * 3_900] * 250 + [" ".join(words[::-1])]

    def searched(word: str, haystack: str) -> bool | None:
        raise AssertionError(f"searched the {len(haystack):,} characters for {word!r}")

    monkeypatch.setattr(features, "_stands_alone", searched)
    assert missing_terms(query, texts) == [] == split_reference(query, texts)
    assert missing_terms(query + " qqqq", texts) == ["qqqq"]
