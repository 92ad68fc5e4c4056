"""The served confidence: calibrated p, the trusted-chunk ranking and retrieve-again advice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sidecar.confidence.features import (
    answer_features,
    attention_shares,
    chunk_features,
    missing_terms,
)
from sidecar.confidence.model import ConfidenceModel
from sidecar.confidence.scorer import (
    ANSWER_FILE,
    CARD_FILE,
    CHUNKS_FILE,
    CalibratedConfidenceScorer,
)
from sidecar.confidence.spec import FeatureValues
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
from sidecar.exceptions import ArtifactError
from sidecar.pipeline.ports import ConfidenceResult
from tests.confidence.factories import fit_models, write_model_dir

Models = tuple[ConfidenceModel, ConfidenceModel]


@pytest.fixture(scope="module")
def models() -> Models:
    return fit_models()


@pytest.fixture
def scorer(models: Models) -> CalibratedConfidenceScorer:
    return CalibratedConfidenceScorer(*models, tau=0.0)


QUERY = "who wrote the novel frankenstein in 1818"
TEXTS = (
    "Mary Shelley wrote Frankenstein.",
    "Gothic fiction is a genre.",
    "Percy Shelley was a poet.",
    "The novel was published anonymously.",
)


def retrieval(scores: tuple[float, ...] = (0.95, 0.15, 0.7, 0.4)) -> RetrievalEvent:
    return RetrievalEvent(
        request_id="req-1",
        tenant="acme",
        collection="wiki",
        query=QUERY,
        k=max(1, len(scores)),
        hits=[
            RetrievalHit(chunk_id=f"c{i}", doc_id=f"d{i}", score=s, text=TEXTS[i])
            for i, s in enumerate(scores)
        ],
    )


FINAL = GenerationFinal(
    request_id="req-1",
    answer="Mary Shelley wrote Frankenstein.",
    generator_model="gen",
    mean_token_logprob=-0.3,
)


def certified(*trusted: str) -> Signals:
    return Signals(
        retrieval=RetrievalSignal(
            status=SignalStatus.OK,
            trusted_chunk_ids=list(trusted),
            m1=bool(trusted),
            m2=len(trusted) / 4,
        ),
        lookback=LookbackSignal(status=SignalStatus.OK, p_factual=0.7),
    )


def test_p_correct_is_the_answer_model_on_the_answer_features(
    scorer: CalibratedConfidenceScorer, models: Models
) -> None:
    signals = certified("c0", "c2")
    result = scorer.score(retrieval(), FINAL, signals)
    features = answer_features(retrieval(), FINAL, signals)
    assert result.features == features
    assert result.p_correct == pytest.approx(models[0].predict_one(features))
    assert result.p_correct is not None and 0.0 <= result.p_correct <= 1.0


def test_p_correct_follows_the_signals(scorer: CalibratedConfidenceScorer) -> None:
    weak = scorer.score(retrieval((0.3, 0.2, 0.1, 0.05)), FINAL, certified())
    strong = scorer.score(retrieval((0.95, 0.9, 0.85, 0.8)), FINAL, certified("c0", "c1"))
    assert weak.p_correct is not None and strong.p_correct is not None
    assert strong.p_correct > weak.p_correct


def test_only_trusted_chunks_are_ranked_when_certification_ran(
    scorer: CalibratedConfidenceScorer, models: Models
) -> None:
    result = scorer.score(retrieval(), FINAL, certified("c3", "c0"))
    assert {f.chunk_id for f in result.chunk_forecast} == {"c0", "c3"}
    ranked = [f.p_useful for f in result.chunk_forecast]
    assert ranked == sorted(ranked, reverse=True)
    # c0 (score .95, rank 0) is more useful than c3 (score .4, rank 3)
    assert [f.chunk_id for f in result.chunk_forecast] == ["c0", "c3"]
    assert ranked[0] > ranked[1]
    assert {f.chunk_id: f.retrieval_rank for f in result.chunk_forecast} == {"c0": 0, "c3": 3}
    rows = chunk_features(retrieval(), FINAL, ["c3", "c0"])
    expected = models[1].predict([rows[0], rows[3]])
    by_id = {f.chunk_id: f.p_useful for f in result.chunk_forecast}
    assert by_id["c0"] == pytest.approx(float(expected[0]))
    assert by_id["c3"] == pytest.approx(float(expected[1]))


@pytest.mark.parametrize("status", [SignalStatus.NOT_CONFIGURED, SignalStatus.UNAVAILABLE], ids=str)
def test_every_chunk_is_ranked_when_certification_did_not_run(
    scorer: CalibratedConfidenceScorer, models: Models, status: SignalStatus
) -> None:
    signals = Signals(retrieval=RetrievalSignal(status=status, trusted_chunk_ids=["c1"]))
    result = scorer.score(retrieval(), FINAL, signals)
    assert result.chunk_forecast[0].chunk_id == "c0"
    assert sorted(f.retrieval_rank for f in result.chunk_forecast) == [0, 1, 2, 3]
    ranked = [f.p_useful for f in result.chunk_forecast]
    assert ranked == sorted(ranked, reverse=True)
    # the trusted feature is missing (not 0 or 1): the stale id list is ignored
    rows = chunk_features(retrieval(), FINAL, None)
    assert sorted(ranked) == pytest.approx(sorted(models[1].predict(rows).tolist()))


def test_no_advice_when_the_best_forecast_reaches_tau(models: Models) -> None:
    best = CalibratedConfidenceScorer(*models, tau=0.0).score(
        retrieval(), FINAL, certified("c0", "c2")
    )
    top = best.chunk_forecast[0].p_useful
    at_tau = CalibratedConfidenceScorer(*models, tau=top).score(
        retrieval(), FINAL, certified("c0", "c2")
    )
    assert at_tau.advice is None


def test_retrieve_again_when_the_best_forecast_is_below_tau(models: Models) -> None:
    signals = certified("c1", "c3")
    top = CalibratedConfidenceScorer(*models, tau=0.0).score(retrieval(), FINAL, signals)
    best = top.chunk_forecast[0].p_useful
    tau = min(1.0, best + 0.01)
    result = CalibratedConfidenceScorer(*models, tau=tau).score(retrieval(), FINAL, signals)
    advice = result.advice
    assert advice is not None
    assert advice.action == "retrieve_again"
    assert advice.best_forecast == pytest.approx(best)
    assert advice.tau == tau
    # "novel" is in chunk 3's text; "1818" is in none of the chunks
    assert advice.missing_terms == ["1818"] == missing_terms(QUERY, list(TEXTS))
    assert "below tau" in advice.hint
    assert "(1818)" in advice.hint
    assert result.chunk_forecast  # the ranking is still published with the advice


def test_retrieve_again_when_nothing_is_trusted(models: Models) -> None:
    result = CalibratedConfidenceScorer(*models, tau=0.2).score(retrieval(), FINAL, certified())
    assert result.chunk_forecast == ()
    assert result.advice is not None
    assert result.advice.best_forecast == 0.0
    assert "no retrieved chunk was trusted" in result.advice.hint


def test_hint_without_missing_terms_asks_for_explicit_names(models: Models) -> None:
    event = retrieval().model_copy(update={"query": "who wrote frankenstein"})
    result = CalibratedConfidenceScorer(*models, tau=0.5).score(event, FINAL, certified())
    assert result.advice is not None
    assert result.advice.missing_terms == []
    assert "naming the entity" in result.advice.hint


def test_no_hits_no_forecast_no_advice(models: Models) -> None:
    empty = retrieval(())
    result = CalibratedConfidenceScorer(*models, tau=0.9).score(empty, FINAL, certified())
    assert result.chunk_forecast == ()
    assert result.advice is None
    assert result.p_correct is not None


def test_tau_outside_the_unit_interval_is_refused(models: Models) -> None:
    with pytest.raises(ArtifactError, match=r"tau must be in \[0, 1\], got 1.5"):
        CalibratedConfidenceScorer(*models, tau=1.5)


# ------------------------------------------------------------------ from_dir


def test_from_dir_round_trip(tmp_path: Path, models: Models) -> None:
    path = write_model_dir(tmp_path / "m", *models, tau=0.35)
    loaded = CalibratedConfidenceScorer.from_dir(path)
    assert loaded.tau == 0.35
    assert loaded.version == f"{models[0].version}+{models[1].version}"
    signals = certified("c0", "c2")
    fresh = CalibratedConfidenceScorer(*models, tau=0.35).score(retrieval(), FINAL, signals)
    assert loaded.score(retrieval(), FINAL, signals) == fresh
    assert CalibratedConfidenceScorer.from_dir(path, tau=0.8).tau == 0.8


@pytest.mark.parametrize("name", [ANSWER_FILE, CHUNKS_FILE, CARD_FILE])
def test_from_dir_names_the_missing_file(tmp_path: Path, models: Models, name: str) -> None:
    path = write_model_dir(tmp_path / "m", *models)
    (path / name).unlink()
    with pytest.raises(ArtifactError, match=f"{name} is missing"):
        CalibratedConfidenceScorer.from_dir(path)


@pytest.mark.parametrize(
    "card",
    ["not json", "[]", "{}", '{"retrieve_again": null}', '{"retrieve_again": {"tau": "high"}}'],
)
def test_from_dir_refuses_a_card_without_tau(tmp_path: Path, models: Models, card: str) -> None:
    path = write_model_dir(tmp_path / "m", *models)
    (path / CARD_FILE).write_text(card, encoding="utf-8")
    with pytest.raises(ArtifactError, match=r"has no retrieve_again\.tau"):
        CalibratedConfidenceScorer.from_dir(path)


def test_from_dir_refuses_a_card_tau_out_of_range(tmp_path: Path, models: Models) -> None:
    path = write_model_dir(tmp_path / "m", *models, tau=2.0)
    with pytest.raises(ArtifactError, match="tau must be in"):
        CalibratedConfidenceScorer.from_dir(path)


def test_from_dir_refuses_swapped_models(tmp_path: Path, models: Models) -> None:
    answer, chunks = models
    path = write_model_dir(tmp_path / "m", chunks, answer)
    with pytest.raises(ArtifactError, match="features differ"):
        CalibratedConfidenceScorer.from_dir(path)


def test_from_dir_refuses_a_tampered_model(tmp_path: Path, models: Models) -> None:
    path = write_model_dir(tmp_path / "m", *models)
    raw = json.loads((path / CHUNKS_FILE).read_text(encoding="utf-8"))
    raw["intercept"] += 1.0
    (path / CHUNKS_FILE).write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ArtifactError, match="sha256"):
        CalibratedConfidenceScorer.from_dir(path)


def test_a_batch_scores_each_request_as_score_does(
    scorer: CalibratedConfidenceScorer,
) -> None:
    """score_batch (one numpy pass per model) = score of each, bit for bit."""
    lookback_only = Signals(lookback=LookbackSignal(status=SignalStatus.OK, p_factual=0.2))
    items = [
        (retrieval(), FINAL, certified("c0", "c2")),
        (retrieval((0.3, 0.2, 0.1, 0.05)), FINAL, certified()),  # nothing trusted: advice
        (retrieval(()), FINAL, lookback_only),  # no hits, no certification
        (retrieval((0.95, 0.9, 0.85, 0.8)), FINAL, Signals()),  # every chunk forecast
    ]
    batch = scorer.score_batch(items)
    assert scorer.score_batch([]) == []
    for (event, final, signals), got in zip(items, batch, strict=True):
        one = scorer.score(event, final, signals)
        assert got.features == one.features and got.advice == one.advice
        assert got.p_correct == one.p_correct
        assert [(f.chunk_id, f.retrieval_rank) for f in got.chunk_forecast] == [
            (f.chunk_id, f.retrieval_rank) for f in one.chunk_forecast
        ]
        for a, b in zip(got.chunk_forecast, one.chunk_forecast, strict=True):
            assert a.p_useful == b.p_useful


def _score_batch_as_before(
    scorer: CalibratedConfidenceScorer,
    items: list[tuple[RetrievalEvent, GenerationFinal, Signals]],
) -> list[ConfidenceResult]:
    """The reference: score_batch as it was, every hit's chunk row built as a dict and
    each model's rows built one by one (``predict_many``)."""
    features = [answer_features(r, f, s) for r, f, s in items]
    p_correct = scorer.answer.predict_many(features)
    chunk_rows: list[FeatureValues] = []
    candidates: list[list[int]] = []
    shares = attention_shares([f for _, f, _ in items], [len(r.hits) for r, _, _ in items])
    for (event, final, signals), answer_shares in zip(items, shares, strict=True):
        rows, kept = scorer._chunk_rows(event, final, signals, answer_shares)
        chunk_rows.extend(rows[i] for i in kept)
        candidates.append(kept)
    probs = scorer.chunks.predict_many(chunk_rows).tolist()
    out: list[ConfidenceResult] = []
    start = 0
    for (event, _, _), values, p, kept in zip(
        items, features, p_correct.tolist(), candidates, strict=True
    ):
        end = start + len(kept)
        out.append(scorer._result(event, values, p, kept, probs[start:end]))
        start = end
    return out


def _random_item(
    rng: np.random.Generator, i: int
) -> tuple[RetrievalEvent, GenerationFinal, Signals]:
    """One request of every kind: 0 to 10 hits (numpy_mean's pairwise sums from 8), scores
    absurd but finite, each certification, lookback and claims status, attention
    summaries that fit, do not fit or are missing, logprobs or none."""
    absurd = [1e300, -1e300, 5e-324, -0.0, 0.0, 0.5, 0.5]
    n_hits = int(rng.integers(0, 11))
    scores = [
        float(rng.choice(absurd)) if rng.random() < 0.2 else float(rng.uniform(-1, 1))
        for _ in range(n_hits)
    ]
    event = RetrievalEvent(
        request_id=f"r{i}",
        tenant="acme",
        collection="wiki",
        query=QUERY,
        k=max(1, n_hits),
        hits=[
            RetrievalHit(chunk_id=f"c{j}", doc_id=f"d{j}", score=s, text=TEXTS[j % 4])
            for j, s in enumerate(scores)
        ],
    )
    ids = [f"c{j}" for j in range(n_hits + 2)]  # trusted ids may name no hit
    kind = rng.integers(0, 4)
    if kind < 2:
        picked = sorted(
            rng.choice(len(ids), size=int(rng.integers(0, len(ids) + 1)), replace=False)
        )
        cert = RetrievalSignal(
            status=SignalStatus.OK,
            trusted_chunk_ids=[ids[j] for j in rng.permutation(picked)],
            m1=bool(picked) if kind == 0 else None,
            m2=float(rng.random()) if kind == 0 else None,
        )
    else:
        status = SignalStatus.NOT_CONFIGURED if kind == 2 else SignalStatus.UNAVAILABLE
        cert = RetrievalSignal(status=status, trusted_chunk_ids=ids[:1])
    lookback = (
        LookbackSignal(
            status=SignalStatus.OK, p_factual=float(rng.choice([0.0, 1.0, rng.random()]))
        )
        if rng.random() < 0.6
        else LookbackSignal(status=SignalStatus.UNAVAILABLE)
    )
    n_claims = int(rng.integers(0, 3))
    claims = (
        ClaimsSignal(
            status=SignalStatus.OK,
            n=n_claims,
            supported=n_claims,
            reliability=float(rng.random()) if n_claims else None,
            hallucination_rate=0.0 if n_claims else None,
        )
        if rng.random() < 0.5
        else ClaimsSignal(status=SignalStatus.NOT_CONFIGURED)
    )
    attention = None
    if n_hits and rng.random() < 0.7:
        width = n_hits if rng.random() < 0.8 else n_hits + 1
        values = rng.uniform(0.0, 2.0, size=(3, 2, width))
        if rng.random() < 0.1:
            values[:] = 0.0
        values[rng.random(values.shape) < 0.1] = -0.0
        attention = AttentionSummary.from_array(
            values, variant="fc" if rng.random() < 0.1 else "cw"
        )
    final = GenerationFinal(
        request_id=f"r{i}",
        answer=" ".join(["word"] * int(rng.integers(0, 40))),
        generator_model="gen",
        attention=attention,
        mean_token_logprob=None if rng.random() < 0.3 else -float(rng.choice([0.0, 1e-300, 3.0])),
    )
    return event, final, Signals(retrieval=cert, lookback=lookback, claims=claims)


@pytest.mark.parametrize("tau", [0.0, 0.4, 1.0])
def test_a_batch_is_the_per_row_batch_bit_for_bit(models: Models, tau: float) -> None:
    """Only the forecast chunks' rows, built as tuples, each model's matrix built by numpy:
    the old batch's results exactly (p_correct, the features, the forecasts, the advice)
    on randomized batches of every kind of request, and on a batch of one."""
    scorer = CalibratedConfidenceScorer(*models, tau=tau)
    rng = np.random.default_rng(int(tau * 10) + 21)
    for b in range(25):
        items = [_random_item(rng, i) for i in range(int(rng.integers(1, 30)))]
        for batch in (items, items[:1]):
            got = scorer.score_batch(batch)
            expected = _score_batch_as_before(scorer, batch)
            assert got == expected, b
            for a, e in zip(got, expected, strict=True):
                assert a.p_correct is not None and e.p_correct is not None
                assert a.p_correct.hex() == e.p_correct.hex()
                assert [(k, repr(v)) for k, v in a.features.items()] == [
                    (k, repr(v)) for k, v in e.features.items()
                ]
                assert [f.model_dump_json() for f in a.chunk_forecast] == [
                    f.model_dump_json() for f in e.chunk_forecast
                ]
                assert (a.advice and a.advice.model_dump_json()) == (
                    e.advice and e.advice.model_dump_json()
                )
    assert scorer.score_batch([]) == []
