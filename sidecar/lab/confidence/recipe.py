"""``guardrail train confidence``: fit the calibrated confidence and the chunk forecast.

From outcome rows (``guardrail dataset outcomes``): every row's recorded
events are replayed through the sidecar with the confidence signal switched
off, which gives the signals exactly as served; the answer-level features
(:func:`~sidecar.confidence.features.answer_features`) with the NQ-open label
fit the answer model, and one row per retrieved chunk
(:func:`~sidecar.confidence.features.chunk_features`) labelled "contains a gold
answer" fits the chunk forecast (docs/methods.md §Calibrated confidence,
Stage 2). The retrieve-again threshold tau is chosen on the chunk model's
held-out part: the tau that best separates requests whose trusted chunks hold
no answer (F1 over a grid).

From Kafka (``--from-kafka``): verdicts (which carry their confidence features)
joined by request_id with ``rag.feedback`` refit the answer model; the chunk
forecast is copied from an existing model directory.

The output directory holds ``answer.json``, ``chunks.json`` and ``card.json``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.confidence.features import CHUNK_SPEC, answer_features, chunk_features
from sidecar.confidence.model import ConfidenceModel
from sidecar.confidence.scorer import ANSWER_FILE, CARD_FILE, CHUNKS_FILE
from sidecar.confidence.spec import ANSWER_SPEC, FeatureValues
from sidecar.config import Settings
from sidecar.contracts.events import (
    AnswerVerdict,
    FeedbackEvent,
    GenerationFinal,
    RetrievalEvent,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import ConfigError
from sidecar.lab.confidence.training import fit_confidence_model, stratified_split
from sidecar.stats.metrics import auroc

__all__ = [
    "ANSWER_FILE",
    "CARD_FILE",
    "CHUNKS_FILE",
    "choose_tau",
    "train_from_kafka",
    "train_from_rows",
]

TAU_GRID = tuple(round(0.05 * i, 2) for i in range(1, 19))


def _without_confidence(settings: Settings) -> Settings:
    signals = settings.signals.model_copy(update={"confidence": False})
    return settings.model_copy(update={"signals": signals})


def _best_forecasts(
    model: ConfidenceModel, chunk_rows: Sequence[list[FeatureValues]]
) -> list[float]:
    """Per request, the best forecast among its trusted chunks (0.0 when none is trusted)."""
    out = []
    for rows in chunk_rows:
        trusted = [r for r in rows if r.get("trusted") != 0.0]
        out.append(float(model.predict(trusted).max()) if trusted else 0.0)
    return out


def _claim_variants(features: FeatureValues) -> list[FeatureValues]:
    """The row as served with claims on, and (when it has claims) as served with them off.

    Claim verification is a switch (``GUARDRAIL_SIGNALS__CLAIMS``); training on both
    forms lets one model serve either configuration with the claims-missing
    indicator doing the work. Both copies share the question's group, so they
    never straddle the fit / calibration split.
    """
    if features.get("claims_reliability") is None:
        return [features]
    masked = dict(features, claims_reliability=None, claims_hallucination_rate=None)
    return [features, masked]


def choose_tau(best: Sequence[float], no_answer: Sequence[bool]) -> tuple[float, dict[str, float]]:
    """The tau of ``TAU_GRID`` with the best F1 for flagging requests with no answer chunk."""
    b = np.asarray(best)
    y = np.asarray(no_answer, dtype=bool)
    best_tau, best_stats = TAU_GRID[0], {"f1": -1.0}
    for tau in TAU_GRID:
        flagged = b < tau
        tp = int((flagged & y).sum())
        precision = tp / flagged.sum() if flagged.any() else 0.0
        recall = tp / y.sum() if y.any() else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        if f1 > best_stats["f1"]:
            best_tau = tau
            best_stats = {
                "f1": f1,
                "precision": precision,
                "recall": recall,
                "flagged_share": float(flagged.mean()),
            }
    return best_tau, best_stats


MIN_ROWS = 20  # outcome rows train_from_rows fits on, at the least


def train_from_rows(
    settings: Settings, paths: Sequence[Path], out: Path, *, seed: int = 0
) -> dict[str, Any]:
    """Fit both models on outcome rows; write them and the card into ``out``."""
    from sidecar.lab.report.collect import default_processor_factory, load_rows  # noqa: PLC0415
    from sidecar.lab.report.evaluate import replay_rows  # noqa: PLC0415
    from sidecar.runtime import served_model_versions  # noqa: PLC0415

    rows = [r for p in paths for r in load_rows(p)]
    if len(rows) < MIN_ROWS:
        raise ConfigError(
            f"{len(rows)} outcome rows is too few to fit a confidence model: it needs at "
            f"least {MIN_ROWS} (the shipped one was fitted on 400); record more with "
            "`guardrail dataset outcomes … --limit N` (it resumes where it stopped)"
        )
    replayed = replay_rows(rows, default_processor_factory(_without_confidence(settings)))
    answer_x: list[FeatureValues] = []
    answer_y: list[int] = []
    answer_groups: list[int] = []
    chunk_groups: list[list[FeatureValues]] = []
    chunk_labels: list[list[int]] = []
    for r in replayed:
        retrieval = RetrievalEvent.model_validate(r.row["retrieval"])
        final = GenerationFinal.model_validate(r.row["final"])
        signals = Signals.model_validate(r.verdict["signals"])
        features = answer_features(retrieval, final, signals)
        for variant in _claim_variants(features):
            answer_x.append(variant)
            answer_y.append(int(r.correct))
            answer_groups.append(int(r.row["qid"]))
        cert = signals.retrieval
        trusted = cert.trusted_chunk_ids if cert.status is SignalStatus.OK else None
        chunk_groups.append(list(chunk_features(retrieval, final, trusted)))
        chunk_labels.append([int(c["contains_answer"]) for c in r.row["chunks"]])
    answer = fit_confidence_model(
        answer_x, answer_y, seed=seed, spec=ANSWER_SPEC, groups=answer_groups
    )

    # The chunk model is split by request, so no request has chunks on both sides.
    fit_idx, held_idx = stratified_split(
        np.asarray([float(max(ls)) for ls in chunk_labels]), 0.7, seed
    )
    fit_x = [x for i in fit_idx for x in chunk_groups[i]]
    fit_y = [y for i in fit_idx for y in chunk_labels[i]]
    fit_g = [int(i) for i in fit_idx for _ in chunk_groups[i]]
    chunks = fit_confidence_model(fit_x, fit_y, seed=seed, spec=CHUNK_SPEC, groups=fit_g)
    held_groups = [chunk_groups[i] for i in held_idx]
    best = _best_forecasts(chunks, held_groups)
    no_answer = [
        not any(
            y and x.get("trusted") != 0.0
            for x, y in zip(chunk_groups[i], chunk_labels[i], strict=True)
        )
        for i in held_idx
    ]
    tau, tau_stats = choose_tau(best, no_answer)
    held_x = [x for g in held_groups for x in g]
    held_y = [y for i in held_idx for y in chunk_labels[i]]
    chunk_auc = (
        float(auroc(chunks.predict(held_x), np.asarray(held_y))) if len(set(held_y)) > 1 else None
    )
    card = _card(
        answer,
        chunks,
        tau=tau,
        tau_stats=tau_stats,
        chunk_heldout={"n_requests": len(held_idx), "n_chunks": len(held_x), "auroc": chunk_auc},
        source={"rows": [str(p) for p in paths], "n_rows": len(rows)},
        inputs=served_model_versions(settings),  # the models the rows were replayed through
    )
    _write(out, answer, chunks, card)
    return card


def _inputs_of(versions: Sequence[tuple[str | None, str | None]]) -> dict[str, str]:
    """The calibration and lookback versions the verdicts name, where all name one (the
    verdicts do not name the claim verifier)."""
    inputs = {}
    for i, name in enumerate(("certifier", "lookback")):
        seen = {v[i] for v in versions}
        if len(seen) == 1 and (only := seen.pop()) is not None:
            inputs[name] = only
    return inputs


def _card(
    answer: ConfidenceModel,
    chunks: ConfidenceModel,
    *,
    tau: float,
    tau_stats: dict[str, float],
    chunk_heldout: dict[str, Any],
    source: dict[str, Any],
    inputs: dict[str, str],
) -> dict[str, Any]:
    return {
        "format": "confidence-card/1",
        "version": f"{answer.version}+{chunks.version}",
        "created_at": datetime.now(UTC).isoformat(),
        "source": source,
        # the models whose scores the features came from: the sidecar refuses to serve this
        # confidence beside other versions of them (runtime.check_confidence_inputs)
        "inputs": inputs,
        "answer": {
            "version": answer.version,
            "n": answer.training.n,
            "positives": answer.training.positives,
            "calibrator": answer.method,
            "metrics": answer.training.metrics,
        },
        "chunks": {
            "version": chunks.version,
            "n": chunks.training.n,
            "positives": chunks.training.positives,
            "calibrator": chunks.method,
            "metrics": chunks.training.metrics,
            "heldout": chunk_heldout,
        },
        "retrieve_again": {"tau": tau, **tau_stats},
    }


def _write(
    out: Path, answer: ConfidenceModel, chunks: ConfidenceModel, card: dict[str, Any]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    answer.save(out / ANSWER_FILE)
    chunks.save(out / CHUNKS_FILE)
    (out / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")


def train_from_kafka(
    settings: Settings, out: Path, *, chunks_from: Path | None, seed: int = 0
) -> dict[str, Any]:
    """Refit the answer model on verdicts joined with feedback read from the broker."""
    import asyncio  # noqa: PLC0415

    from sidecar.kafka.read import read_topics  # noqa: PLC0415

    source_dir = chunks_from or Path(settings.models.dir) / settings.signals.confidence_model
    if not (source_dir / CHUNKS_FILE).exists():
        raise ConfigError(
            f"--from-kafka refits the answer model only; the chunk forecast is copied from "
            f"{source_dir / CHUNKS_FILE}, which does not exist (pass --chunks-from DIR)"
        )
    topics = settings.topics
    records = asyncio.run(read_topics(settings, [topics.verdicts, topics.feedback]))
    features: dict[str, dict[str, float | None]] = {}
    scored_by: dict[str, tuple[str | None, str | None]] = {}
    labels: dict[str, bool] = {}
    for topic, value in records:
        try:
            if topic == topics.verdicts:
                verdict = AnswerVerdict.model_validate_json(value)
                if verdict.confidence_features and verdict.stage == "final":
                    features[verdict.request_id] = verdict.confidence_features
                    scored_by[verdict.request_id] = (
                        verdict.signals.retrieval.calibration_version,
                        verdict.signals.lookback.model_version,
                    )
            else:
                fb = FeedbackEvent.model_validate_json(value)
                if not fb.abstained:
                    labels[fb.request_id] = fb.correct
        except ValueError:
            continue  # not ours to judge here: the sidecar dead-letters bad input
    joined = sorted(set(features) & set(labels))
    if len(joined) < 20:
        raise ConfigError(
            f"only {len(joined)} verdicts have feedback ({len(features)} verdicts with "
            f"features, {len(labels)} feedback events); need at least 20"
        )
    answer = fit_confidence_model(
        [features[r] for r in joined], [int(labels[r]) for r in joined], seed=seed, spec=ANSWER_SPEC
    )
    chunks = ConfidenceModel.load(source_dir / CHUNKS_FILE, spec=CHUNK_SPEC)
    old_card = json.loads((source_dir / CARD_FILE).read_text(encoding="utf-8"))
    card = _card(
        answer,
        chunks,
        tau=float(old_card["retrieve_again"]["tau"]),
        tau_stats={k: v for k, v in old_card["retrieve_again"].items() if k != "tau"},
        chunk_heldout=old_card["chunks"].get("heldout", {}),
        source={
            "kafka": settings.kafka.bootstrap_servers,
            "verdicts": len(features),
            "feedback": len(labels),
            "joined": len(joined),
            "chunks_from": str(source_dir),
        },
        inputs=_inputs_of([scored_by[r] for r in joined]),
    )
    out.mkdir(parents=True, exist_ok=True)
    answer.save(out / ANSWER_FILE)
    if source_dir.resolve() != out.resolve():
        shutil.copyfile(source_dir / CHUNKS_FILE, out / CHUNKS_FILE)
    (out / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return card
