"""The sidecar's confidence component: calibrated p(correct), chunk forecast, retrieve-again advice.

Loads a model directory written by ``guardrail train confidence``
(``answer.json``, ``chunks.json``, ``card.json``) and, for each decided request:

* computes the answer features from the events and the signals and serves the
  calibrated probability that the answer is correct (the forecasting
  function of docs/methods.md §Calibrated confidence, fitted on labelled outcomes);
* forecasts, for each trusted chunk (every retrieved chunk when certification
  did not run), the probability that it supports a correct answer, and ranks
  the chunks by it (Stage 2);
* when the best forecast is below tau (or nothing is trusted), advises
  ``retrieve_again`` once, with a reformulation hint (Stage 3 is the LLM
  service's job).

numpy + pydantic only: this is on the serving path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sidecar.confidence.features import (
    ANSWER_FEATURES,
    CHUNK_FEATURES,
    CHUNK_SPEC,
    answer_features,
    attention_shares,
    chunk_features,
    missing_terms,
)
from sidecar.confidence.model import ConfidenceModel
from sidecar.contracts.assembled import assembled, unit_float
from sidecar.contracts.events import (
    ChunkForecast,
    GenerationFinal,
    RetrievalEvent,
    RetrieveAgain,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import ArtifactError
from sidecar.hashing import not_a_regular_file
from sidecar.pipeline.ports import ConfidenceResult

__all__ = ["ANSWER_FILE", "CARD_FILE", "CHUNKS_FILE", "CalibratedConfidenceScorer"]

ANSWER_FILE = "answer.json"
CHUNKS_FILE = "chunks.json"
CARD_FILE = "card.json"


class CalibratedConfidenceScorer:
    """Plain-number models (JSON) evaluated with numpy; no scikit-learn at run time."""

    def __init__(
        self,
        answer: ConfidenceModel,
        chunks: ConfidenceModel,
        *,
        tau: float,
        fitted_on: dict[str, str] | None = None,
    ) -> None:
        if not 0.0 <= tau <= 1.0:
            raise ArtifactError(f"retrieve-again tau must be in [0, 1], got {tau}")
        self.answer = answer
        self.chunks = chunks
        self.tau = tau
        # the models whose outputs its features were computed from ("certifier", "lookback",
        # "verifier" -> version; the card's ``inputs``); None: a card written before it
        self.fitted_on = fitted_on

    @classmethod
    def from_dir(cls, path: Path, *, tau: float | None = None) -> CalibratedConfidenceScorer:
        """Load ``answer.json``, ``chunks.json`` and the card's tau (unless ``tau`` overrides)."""
        for name in (ANSWER_FILE, CHUNKS_FILE, CARD_FILE):
            problem = not_a_regular_file(path / name)
            if problem is not None and problem != "does not exist":
                raise ArtifactError(f"{path / name} {problem}")
            if problem is not None:
                raise ArtifactError(
                    f"{path / name} is missing; a confidence model directory holds "
                    f"{ANSWER_FILE}, {CHUNKS_FILE} and {CARD_FILE} ('guardrail train confidence')"
                )
        try:
            card = json.loads((path / CARD_FILE).read_text(encoding="utf-8"))
            card_tau = float(card["retrieve_again"]["tau"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"{path / CARD_FILE} has no retrieve_again.tau: {exc}") from None
        inputs = card.get("inputs")
        if inputs is not None and not (
            isinstance(inputs, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in inputs.items())
        ):
            raise ArtifactError(
                f"{path / CARD_FILE}: inputs must map a signal to its model version, got {inputs!r}"
            )
        return cls(
            ConfidenceModel.load(path / ANSWER_FILE),
            ConfidenceModel.load(path / CHUNKS_FILE, spec=CHUNK_SPEC),
            tau=card_tau if tau is None else tau,
            fitted_on=inputs,
        )

    @property
    def version(self) -> str:
        return f"{self.answer.version}+{self.chunks.version}"

    def score(
        self, retrieval: RetrievalEvent, final: GenerationFinal, signals: Signals
    ) -> ConfidenceResult:
        """One request, in plain floats (``predict_one``)."""
        features = answer_features(retrieval, final, signals)
        rows, candidates = self._chunk_rows(retrieval, final, signals)
        probs = [self.chunks.predict_one(rows[i]) for i in candidates]
        return self._result(
            retrieval, features, self.answer.predict_one(features), candidates, probs
        )

    def score_batch(
        self, items: Sequence[tuple[RetrievalEvent, GenerationFinal, Signals]]
    ) -> list[ConfidenceResult]:
        """The requests decided together: each model makes one numpy pass over all their rows.

        :meth:`score` of each, bit for bit: each request's numbers are the same whatever
        other requests share its batch (``row_scores``; ``predict_one`` computes as
        ``predict_rows`` does).
        Only the forecast chunks' rows are built (the trusted hits, or every hit), as
        tuples in :data:`CHUNK_FEATURES` order; each model's matrix is numpy's.
        """
        features = [answer_features(r, f, s) for r, f, s in items]
        p_correct = self.answer.predict_rows(
            [tuple(values.values()) for values in features], ANSWER_FEATURES
        ).tolist()
        shares = attention_shares([f for _, f, _ in items], [len(r.hits) for r, _, _ in items])
        chunk_rows: list[tuple[float, float, float, float | None, float | None]] = []
        candidates: list[list[int]] = []
        for (retrieval, _, signals), answer_shares in zip(items, shares, strict=True):
            hits = retrieval.hits
            if not hits:
                candidates.append([])
                continue
            top = max([h.score for h in hits])
            cert = signals.retrieval
            if cert.status is SignalStatus.OK:  # the trusted hits: ``trusted`` is 1.0
                wanted = set(cert.trusted_chunk_ids)
                kept = [i for i, h in enumerate(hits) if h.chunk_id in wanted]
                trusted: float | None = 1.0
            else:  # certification did not run: every hit, ``trusted`` missing
                kept = list(range(len(hits)))
                trusted = None
            for i in kept:
                score = hits[i].score
                chunk_rows.append((score, top - score, 1.0 / (i + 1), trusted, answer_shares[i]))
            candidates.append(kept)
        probs = self.chunks.predict_rows(chunk_rows, CHUNK_FEATURES).tolist()
        out: list[ConfidenceResult] = []
        start = 0
        for (retrieval, _, _), values, p, kept in zip(
            items, features, p_correct, candidates, strict=True
        ):
            end = start + len(kept)
            out.append(self._result(retrieval, values, p, kept, probs[start:end]))
            start = end
        return out

    def _chunk_rows(
        self,
        retrieval: RetrievalEvent,
        final: GenerationFinal,
        signals: Signals,
        shares: Sequence[float | None] | None = None,
    ) -> tuple[list[dict[str, float | None]], list[int]]:
        """Every hit's chunk features, and the positions forecast (trusted, or all)."""
        cert = signals.retrieval
        trusted = cert.trusted_chunk_ids if cert.status is SignalStatus.OK else None
        rows = chunk_features(retrieval, final, trusted, shares=shares)
        if trusted is None:
            return rows, list(range(len(rows)))
        return rows, [i for i, row in enumerate(rows) if row["trusted"] == 1.0]

    def _result(
        self,
        retrieval: RetrievalEvent,
        features: dict[str, float | None],
        p_correct: float,
        candidates: Sequence[int],
        probs: Sequence[float],
    ) -> ConfidenceResult:
        """Rank the forecast chunks; advise retrieving again below tau."""
        hits = retrieval.hits
        order: Sequence[int] = range(len(candidates))  # one chunk or none: no sort
        if len(candidates) > 1:
            order = sorted(order, key=lambda j: -probs[j])
        forecasts = tuple(
            [
                chunk_forecast(hits[candidates[j]].chunk_id, float(probs[j]), candidates[j])
                for j in order
            ]
        )
        best = forecasts[0].p_useful if forecasts else 0.0
        advice = None
        if hits and (not forecasts or best < self.tau):
            missing = missing_terms(retrieval.query, [h.text for h in hits])
            why = (
                f"the best chunk forecast {best:.2f} is below tau {self.tau:.2f}"
                if forecasts
                else "no retrieved chunk was trusted"
            )
            hint = f"{why}: retrieve again with a reformulated query"
            hint += (
                f" that keeps the terms the chunks miss ({', '.join(missing)})"
                if missing
                else " naming the entity, place or time period explicitly"
            )
            advice = RetrieveAgain(
                best_forecast=best, tau=self.tau, hint=hint, missing_terms=missing
            )
        return ConfidenceResult(
            p_correct=float(p_correct),
            features=features,
            chunk_forecast=forecasts,
            advice=advice,
        )


def chunk_forecast(chunk_id: str, p_useful: float, retrieval_rank: int) -> ChunkForecast:
    """``ChunkForecast(...)``, built without validation when its values already pass.

    A request forecasts each trusted chunk: validating each cost ~1 us of the
    confidence scorer's time. A probability that is not a float in
    [0, 1] (a NaN from a broken model) or a rank that is not an int >= 0 is validated
    as before, which raises the same error.
    """
    if (
        unit_float(p_useful)
        and type(retrieval_rank) is int
        and retrieval_rank >= 0
        and type(chunk_id) is str
    ):
        return assembled(
            ChunkForecast,
            {"chunk_id": chunk_id, "p_useful": p_useful, "retrieval_rank": retrieval_rank},
        )
    return ChunkForecast(chunk_id=chunk_id, p_useful=p_useful, retrieval_rank=retrieval_rank)
