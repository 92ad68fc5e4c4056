"""What the calibrated confidence and the chunk forecast see of a request."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.confidence.features import (
    ANSWER_FEATURES,
    CHUNK_FEATURES,
    CHUNK_SPEC,
    answer_features,
    attention_shares,
    chunk_features,
    missing_terms,
    numpy_mean,
)
from sidecar.confidence.spec import ANSWER_SPEC, SIGNALS
from sidecar.contracts.events import (
    AttentionSummary,
    ClaimsSignal,
    GenerationFinal,
    LookbackSignal,
    RetrievalEvent,
    RetrievalHit,
    RetrievalSignal,
    Signals,
    SignalStatus,
)


def retrieval(scores: list[float], query: str = "who wrote frankenstein") -> RetrievalEvent:
    return RetrievalEvent(
        request_id="req-1",
        tenant="acme",
        collection="wiki",
        query=query,
        k=max(1, len(scores)),
        hits=[
            RetrievalHit(chunk_id=f"c{i}", doc_id=f"d{i}", score=s, text=f"text {i}")
            for i, s in enumerate(scores)
        ],
    )


def final(answer: str = "Mary Shelley wrote it.", **extra: Any) -> GenerationFinal:
    return GenerationFinal(request_id="req-1", answer=answer, generator_model="gen", **extra)


def all_signals() -> Signals:
    return Signals(
        retrieval=RetrievalSignal(
            status=SignalStatus.OK, trusted_chunk_ids=["c0"], m1=True, m2=0.25
        ),
        lookback=LookbackSignal(status=SignalStatus.OK, p_factual=0.8),
        claims=ClaimsSignal(
            status=SignalStatus.OK, n=4, supported=3, reliability=0.7, hallucination_rate=0.25
        ),
    )


# ------------------------------------------------------------------ answer features


def test_answer_features_read_every_signal() -> None:
    got = answer_features(retrieval([0.5, 0.9, 0.1]), final(mean_token_logprob=-0.4), all_signals())
    assert tuple(got) == SIGNALS == ANSWER_FEATURES
    assert got["retrieval_top_score"] == 0.9
    assert got["retrieval_margin"] == pytest.approx(0.4)  # best minus second best, not order
    assert got["retrieval_mean_score"] == pytest.approx(0.5)
    assert got["m1"] == 1.0 and got["m2"] == 0.25
    assert got["lookback_p"] == 0.8
    assert got["claims_reliability"] == 0.7 and got["claims_hallucination_rate"] == 0.25
    assert got["mean_token_logprob"] == -0.4
    assert got["answer_words_log1p"] == pytest.approx(math.log1p(4))


def test_an_uncovered_request_reads_m1_zero_not_missing() -> None:
    signals = Signals(
        retrieval=RetrievalSignal(status=SignalStatus.OK, m1=False, m2=0.0),
    )
    got = answer_features(retrieval([0.2]), final(), signals)
    assert got["m1"] == 0.0 and got["m2"] == 0.0


def test_signals_not_served_are_missing_never_zero() -> None:
    got = answer_features(retrieval([0.7]), final(), Signals())
    for name in ("m1", "m2", "lookback_p", "claims_reliability", "claims_hallucination_rate"):
        assert got[name] is None, name
    assert got["mean_token_logprob"] is None
    assert got["retrieval_margin"] == 0.0  # one hit: no gap, a real zero


@pytest.mark.parametrize(
    "signals",
    [
        Signals(
            retrieval=RetrievalSignal(status=SignalStatus.UNAVAILABLE, m1=True, m2=0.5),
            lookback=LookbackSignal(status=SignalStatus.UNAVAILABLE, p_factual=0.9),
            claims=ClaimsSignal(status=SignalStatus.UNAVAILABLE, n=3, reliability=0.9),
        ),
        Signals(
            retrieval=RetrievalSignal(status=SignalStatus.OK, m1=None),
            claims=ClaimsSignal(status=SignalStatus.OK, n=0, reliability=0.9),
        ),
    ],
    ids=["unavailable", "ok-but-empty"],
)
def test_unavailable_or_empty_signals_are_missing(signals: Signals) -> None:
    got = answer_features(retrieval([0.7, 0.6]), final(), signals)
    assert got["m1"] is None and got["m2"] is None
    assert got["lookback_p"] is None
    assert got["claims_reliability"] is None and got["claims_hallucination_rate"] is None


def test_no_hits_leaves_the_retrieval_features_missing() -> None:
    got = answer_features(retrieval([]), final(answer=""), Signals())
    assert got["retrieval_top_score"] is None
    assert got["retrieval_margin"] is None
    assert got["retrieval_mean_score"] is None
    assert got["answer_words_log1p"] == 0.0
    ANSWER_SPEC.vector(got)  # the model accepts the row as it is


# ------------------------------------------------------------------ chunk features


def test_chunk_features_one_row_per_hit_in_retrieval_order() -> None:
    rows = chunk_features(retrieval([0.4, 0.9, 0.6]), final(), ["c1", "c2"])
    assert [tuple(r) for r in rows] == [CHUNK_FEATURES] * 3
    assert [r["score"] for r in rows] == [0.4, 0.9, 0.6]
    assert [r["gap_to_top"] for r in rows] == pytest.approx([0.5, 0.0, 0.3])
    assert [r["inverse_rank"] for r in rows] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [r["trusted"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["attention_share"] for r in rows] == [None, None, None]  # no summary sent


def test_trusted_is_missing_when_certification_did_not_run() -> None:
    rows = chunk_features(retrieval([0.4, 0.9]), final(), None)
    assert [r["trusted"] for r in rows] == [None, None]
    x = CHUNK_SPEC.vector(rows[0])
    names = CHUNK_SPEC.names
    assert x[names.index("trusted_missing")] == 1.0
    assert x[names.index("attention_missing")] == 1.0
    # certified, nothing trusted: a real zero, no missing flag
    x = CHUNK_SPEC.vector(chunk_features(retrieval([0.4]), final(), [])[0])
    assert x[names.index("trusted")] == 0.0
    assert x[names.index("trusted_missing")] == 0.0


def test_chunk_spec_is_the_features_then_their_indicators() -> None:
    assert CHUNK_SPEC.names == (*CHUNK_FEATURES, "trusted_missing", "attention_missing")
    assert CHUNK_SPEC.missing_groups == {
        "trusted_missing": ("trusted",),
        "attention_missing": ("attention_share",),
    }


def test_no_hits_gives_no_chunk_rows() -> None:
    assert chunk_features(retrieval([]), final(), ["c0"]) == []


def test_attention_share_is_the_chunk_share_of_mean_lookback() -> None:
    # layer 0: [1, 3], layer 1: [1, 1] -> mean [1, 2] -> shares [1/3, 2/3]
    att = AttentionSummary.from_array(np.array([[[1.0, 3.0]], [[1.0, 1.0]]]))
    rows = chunk_features(retrieval([0.9, 0.8]), final(attention=att), ["c0"])
    assert [r["attention_share"] for r in rows] == pytest.approx([1 / 3, 2 / 3])
    x = CHUNK_SPEC.vector(rows[0])
    assert x[CHUNK_SPEC.names.index("attention_missing")] == 0.0


@pytest.mark.parametrize(
    ("array", "variant", "hits"),
    [
        (np.ones((1, 1, 2)), "fc", 2),  # full-context summary: not per chunk
        (np.ones((1, 1, 3)), "cw", 2),  # a column per chunk, but not these chunks
        (np.zeros((1, 2, 2)), "cw", 2),  # no attention at all: shares undefined
    ],
    ids=["full-context", "chunk-count-mismatch", "all-zero"],
)
def test_unusable_attention_leaves_the_share_missing(
    array: np.ndarray, variant: str, hits: int
) -> None:
    att = AttentionSummary.from_array(array, variant="fc" if variant == "fc" else "cw")
    rows = chunk_features(retrieval([0.9, 0.5][:hits]), final(attention=att), None)
    assert [r["attention_share"] for r in rows] == [None] * hits


def test_without_a_final_event_the_share_is_missing() -> None:
    rows = chunk_features(retrieval([0.9, 0.5]), None, ["c0"])
    assert [r["attention_share"] for r in rows] == [None, None]
    assert [r["trusted"] for r in rows] == [1.0, 0.0]


def test_a_batch_of_attention_shares_is_each_answer_alone_bit_for_bit() -> None:
    """Summaries of one shape are averaged together; each share is the per-answer numpy
    computation (float32 mean over layers and heads, float64 shares) exactly."""
    rng = np.random.default_rng(5)
    finals: list[GenerationFinal | None] = [None]
    n_hits = [2]
    for i in range(40):
        layers, heads, chunks = (30, 9, 3) if i % 3 else (int(rng.integers(1, 6)), 2, 4)
        values = rng.uniform(0.0, 1.0, size=(layers, heads, chunks))
        if i % 7 == 0:
            values[:] = 0.0  # all zero: no shares
        variant: Literal["cw", "fc"] = "fc" if i % 11 == 5 else "cw"
        finals.append(final(attention=AttentionSummary.from_array(values, variant=variant)))
        n_hits.append(chunks if i % 13 else chunks + 1)  # a mismatch now and then
    batch = attention_shares(finals, n_hits)
    for got, answer, k in zip(batch, finals, n_hits, strict=True):
        att = answer.attention if answer is not None else None
        expected: list[float | None] = [None] * k
        if att is not None and att.variant == "cw" and att.chunks == k:
            per_chunk = att.to_array().mean(axis=(0, 1)).astype(np.float64)
            total = float(per_chunk.sum())
            if total > 0.0:
                expected = [float(v / total) for v in per_chunk]
        assert [None if v is None else v.hex() for v in got] == [
            None if v is None else v.hex() for v in expected
        ]
    assert sum(row[0] is not None for row in batch) > 20  # most answers have shares


# ------------------------------------------------------------------ missing terms


def test_missing_terms_are_query_content_words_no_chunk_mentions() -> None:
    got = missing_terms(
        "Who wrote the novel Frankenstein in 1818? Frankenstein, NOVEL!",
        ["Mary Shelley WROTE Frankenstein.", "A gothic story."],
    )
    # stopwords (who, the), short words (in), words the chunks have (wrote, frankenstein)
    # are dropped; case-insensitive; each term once, in query order
    assert got == ["novel", "1818"]


def test_missing_terms_respects_the_limit_and_order() -> None:
    query = "alpha bravo charlie delta echo foxtrot golf"
    assert missing_terms(query, []) == ["alpha", "bravo", "charlie", "delta", "echo"]
    assert missing_terms(query, ["bravo delta"], limit=3) == ["alpha", "charlie", "echo"]
    assert missing_terms(query, [query]) == []


def test_a_word_inside_another_word_is_not_a_mention() -> None:
    # "art" is not mentioned by "party": matching is by whole words
    assert missing_terms("modern art", ["a party in the modern city"]) == ["art"]


_WORDS = st.text(alphabet="abcdefgh XYZ019.,", max_size=60)


@settings(max_examples=200, deadline=None)
@given(query=_WORDS, texts=st.lists(_WORDS, max_size=4), limit=st.integers(0, 6))
def test_missing_terms_invariants(query: str, texts: list[str], limit: int) -> None:
    got = missing_terms(query, texts, limit=limit)
    words_in_texts = {w for t in texts for w in re.findall(r"[a-z0-9]+", t.lower())}
    query_words = re.findall(r"[a-z0-9]+", query.lower())
    assert len(got) <= limit
    assert len(set(got)) == len(got)
    for term in got:
        assert term in query_words
        assert term not in words_in_texts
        assert len(term) > 2
    # query order is kept
    assert got == sorted(got, key=query_words.index)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_subnormal=True),
        min_size=1,
        max_size=20,
    )
)
def test_numpy_mean_is_np_mean_bit_for_bit(values: list[float]) -> None:
    assert numpy_mean(values).hex() == float(np.mean(values)).hex()  # -0.0 and 0.0 apart
