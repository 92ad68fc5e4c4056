"""The compact evidence index ranks as the plain set-per-sentence index did, and counts its bytes.

The index is held while an answer streams and counted in the request's byte
budget (``EvidenceIndex.nbytes``), so it keeps flat arrays instead of a set of
term strings per sentence (15x the raw text before, on 1 MB of documents).
"""

from __future__ import annotations

import json
import math
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.claims.evidence import _GLUED, EvidenceChunk, EvidenceIndex, content_terms
from sidecar.claims.sentences import split_sentences

SLICE = Path(__file__).parent / "data" / "halueval_qa_test_slice.jsonl"


def _plain_scores(chunks: list[str], terms: set[str]) -> list[float]:
    """The plain index's per-sentence score: IDF-weighted terms held, numbers double."""
    units = [
        frozenset(content_terms(s.text))
        for text in chunks
        for s in split_sentences(_GLUED.sub(r"\1 ", text))
    ]
    df: Counter[str] = Counter()
    for unit in units:
        df.update(unit)
    n = max(1, len(units))
    idf = {t: math.log((n + 1) / (c + 1)) + 1.0 for t, c in df.items()}

    def weight(t: str) -> float:
        w = idf.get(t, math.log(n + 1) + 1.0)
        return 2.0 * w if t[0].isdigit() else w

    return [math.fsum(weight(t) for t in terms & unit) for unit in units]


def _records() -> list[dict[str, str]]:
    return [json.loads(line) for line in SLICE.read_text(encoding="utf-8").splitlines()]


def test_scores_equal_the_plain_index_on_real_knowledge() -> None:
    records = _records()
    chunks = [r["knowledge"] for r in records[:20]]
    index = EvidenceIndex([EvidenceChunk(f"c{i}", t) for i, t in enumerate(chunks)])
    assert len(index) > 20
    for r in records:
        for text in (r["right_answer"], r["hallucinated_answer"], r["question"]):
            terms = set(content_terms(text))
            got = index._scores(terms)
            np.testing.assert_allclose(got, _plain_scores(chunks, terms), rtol=1e-12, atol=0)


words = st.sampled_from(["tower", "Paris", "iron", "1889", "opened", "built", "x", "2,500", "the"])
sentence = st.lists(words, min_size=1, max_size=8).map(lambda w: " ".join(w) + ".")
chunk = st.lists(sentence, min_size=1, max_size=5).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(chunk, min_size=1, max_size=4), claim=st.lists(words, max_size=6))
def test_scores_and_order_equal_the_plain_index(chunks: list[str], claim: list[str]) -> None:
    index = EvidenceIndex([EvidenceChunk(f"c{i}", t) for i, t in enumerate(chunks)])
    terms = set(content_terms(" ".join(claim)))
    expected = _plain_scores(chunks, terms)
    scores = index._scores(terms)
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-12)
    order = index._ranked(scores).tolist()
    # highest first, ties by sentence order (the plain index sorted (score, -k) descending)
    assert order == sorted(range(len(expected)), key=lambda k: (-scores[k], k))


def test_nbytes_is_what_the_index_holds_and_a_few_times_the_text() -> None:
    records = _records()
    chunks = [r["knowledge"] * 40 for r in records]  # ~0.8 MB of sentences
    raw = sum(len(c) for c in chunks)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = EvidenceIndex([EvidenceChunk(f"c{i}", t) for i, t in enumerate(chunks)])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # the chunks themselves are the caller's; the index's own bytes are counted within 25 %
    assert index.nbytes == pytest.approx(held, rel=0.25)
    assert index.nbytes < 4 * raw


def test_an_empty_index_selects_nothing() -> None:
    index = EvidenceIndex([])
    assert len(index) == 0 and index.nbytes < 100
    assert index.select("anything").window == ""
    assert index.windows("anything") == ()
