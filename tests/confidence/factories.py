"""Small fitted confidence models on synthetic rows, and a model directory to load them from."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.confidence.features import CHUNK_SPEC
from sidecar.confidence.model import ConfidenceModel
from sidecar.confidence.scorer import ANSWER_FILE, CARD_FILE, CHUNKS_FILE
from sidecar.confidence.spec import ANSWER_SPEC, FeatureValues
from sidecar.lab.confidence.training import fit_confidence_model


def answer_rows(n: int = 300, seed: int = 0) -> tuple[list[FeatureValues], list[int]]:
    """P(correct) rises with the top retrieval score and lookback p; some groups missing."""
    rng = np.random.default_rng(seed)
    rows: list[FeatureValues] = []
    labels: list[int] = []
    for _ in range(n):
        u = float(rng.normal())
        top = 0.6 + 0.1 * u + 0.03 * float(rng.normal())
        row: dict[str, float | None] = {
            "retrieval_top_score": top,
            "retrieval_margin": abs(0.05 + 0.02 * float(rng.normal())),
            "retrieval_mean_score": top - 0.1,
            "m1": float(top > 0.6),
            "m2": float(rng.random()),
            "lookback_p": 1.0 / (1.0 + math.exp(-(u + float(rng.normal())))),
            "claims_reliability": None,
            "claims_hallucination_rate": None,
            "mean_token_logprob": None if rng.random() < 0.3 else -0.5 + 0.1 * u,
            "answer_words_log1p": math.log1p(int(rng.integers(1, 30))),
        }
        rows.append(row)
        labels.append(int(rng.random() < 1.0 / (1.0 + math.exp(-2.0 * u))))
    return rows, labels


def chunk_rows(n: int = 400, seed: int = 1) -> tuple[list[FeatureValues], list[int]]:
    """A chunk is useful mostly when its retrieval score is high."""
    rng = np.random.default_rng(seed)
    rows: list[FeatureValues] = []
    labels: list[int] = []
    for _ in range(n):
        score = float(rng.random())
        rank = int(rng.integers(0, 5))
        rows.append(
            {
                "score": score,
                "gap_to_top": float(rng.random()) * 0.3,
                "inverse_rank": 1.0 / (rank + 1),
                "trusted": None if rng.random() < 0.3 else float(score > 0.5),
                "attention_share": None if rng.random() < 0.5 else float(rng.random()),
            }
        )
        labels.append(int(rng.random() < 0.05 + 0.9 * score))
    return rows, labels


def fit_models() -> tuple[ConfidenceModel, ConfidenceModel]:
    """``(answer model, chunk model)``."""
    x, y = answer_rows()
    answer = fit_confidence_model(x, y, spec=ANSWER_SPEC, seed=0)
    cx, cy = chunk_rows()
    chunks = fit_confidence_model(cx, cy, spec=CHUNK_SPEC, seed=0)
    return answer, chunks


def write_model_dir(
    out: Path,
    answer: ConfidenceModel,
    chunks: ConfidenceModel,
    *,
    tau: float = 0.3,
    card: dict[str, Any] | None = None,
) -> Path:
    """``answer.json``, ``chunks.json`` and ``card.json`` as ``guardrail train confidence`` does."""
    out.mkdir(parents=True, exist_ok=True)
    answer.save(out / ANSWER_FILE)
    chunks.save(out / CHUNKS_FILE)
    body = card if card is not None else {"retrieve_again": {"tau": tau}}
    (out / CARD_FILE).write_text(json.dumps(body), encoding="utf-8")
    return out
