"""Held-out evaluation of lookback models through the serving path (no torch, no sklearn).

Every answer is turned into the ``GenerationFinal`` event a service would
publish (generator id, ``AttentionSummary`` in the model's variant, float16 on
the wire) and scored by :class:`~sidecar.lookback.serving.OnnxLookbackScorer`
exactly as the sidecar does -- without a certification, so every chunk column
is kept, as in training. Used by ``guardrail eval lookback`` both on a recorded
held-out dataset (``--data``) and live (:mod:`sidecar.lab.generator.evaluate`).

Questions must be disjoint from the model's training questions: from the same
question file, only the ``eval`` part of the deterministic split (which the
dataset builder's default ``fit`` part never contains) is accepted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sidecar.contracts.events import (
    AttentionSummary,
    GenerationFinal,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.exceptions import ConfigError
from sidecar.lab.lookback.dataset import EVAL_FRACTION, LOOKBACK_SPLIT_SEED, load_dataset
from sidecar.lookback.serving import LookbackRequest, OnnxLookbackScorer
from sidecar.stats.metrics import auroc

__all__ = ["NO_CERTIFICATION", "check_disjoint", "evaluate_recorded", "report"]

log = logging.getLogger(__name__)

NO_CERTIFICATION = RetrievalSignal(status=SignalStatus.NOT_CONFIGURED)


def check_disjoint(
    scorer: OnnxLookbackScorer,
    questions_sha256: str,
    part: str,
    *,
    split_seed: int = LOOKBACK_SPLIT_SEED,
    eval_fraction: float = EVAL_FRACTION,
) -> None:
    """Refuse an evaluation that could reuse the model's training questions."""
    training = scorer.metadata.training
    if questions_sha256 != training.questions_sha256:
        log.warning(
            "not the question file %s was trained on: disjointness is not checked",
            scorer.version,
        )
        return
    if part != "eval":
        raise ConfigError(
            f"{scorer.version} was trained on the '{training.question_part}' part of this "
            f"question file; evaluate on --part eval (got --part {part})"
        )
    if (training.question_split_seed, training.question_eval_fraction) != (
        split_seed,
        eval_fraction,
    ):
        raise ConfigError(
            f"{scorer.version} used question split seed {training.question_split_seed} / eval "
            f"fraction {training.question_eval_fraction}; the evaluation data was split with "
            f"{split_seed} / {eval_fraction}, so the parts may overlap"
        )


def report(
    scorer: OnnxLookbackScorer,
    p_factual: Sequence[float],
    labels: npt.ArrayLike,
    *,
    part: str,
    source: str,
    mean_logprob: Sequence[float] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON result of one model: n, AUROC, positive rate, variant, baselines."""
    y = np.asarray(labels).astype(np.int64)
    out: dict[str, Any] = {
        "model": scorer.metadata.name,
        "model_version": scorer.version,
        "variant": scorer.metadata.variant,
        "generator_model": scorer.metadata.generator_model,
        "source": source,
        "part": part,
        "n": int(y.size),
        "positive_rate": float(y.mean()) if y.size else 0.0,
        "auroc": _maybe_auroc(p_factual, y),
        "auroc_mean_logprob": None if mean_logprob is None else _maybe_auroc(mean_logprob, y),
    }
    out.update(extra or {})
    return out


def _maybe_auroc(scores: Sequence[float] | npt.ArrayLike, labels: npt.ArrayLike) -> float | None:
    try:
        return auroc(scores, labels)
    except ConfigError:
        return None


def evaluate_recorded(
    model_dirs: Sequence[str | Path], data_dir: str | Path, *, batch_size: int = 64
) -> list[dict[str, Any]]:
    """Score a recorded held-out dataset (``dataset lookback --part eval``) with each model."""
    data = load_dataset(data_dir)
    meta = data.meta
    results = []
    for model_dir in model_dirs:
        scorer = OnnxLookbackScorer.from_dir(model_dir)
        check_disjoint(
            scorer,
            meta.questions_sha256,
            meta.part,
            split_seed=meta.split_seed,
            eval_fraction=meta.eval_fraction,
        )
        variant = scorer.metadata.variant
        requests = [
            LookbackRequest(
                GenerationFinal(
                    request_id=f"eval-{int(q)}",
                    answer=str(rec.get("answer", "")),
                    generator_model=meta.generator_model,
                    attention=AttentionSummary.from_array(r, variant=variant),
                ),
                NO_CERTIFICATION,
            )
            for q, r, rec in zip(data.rows.qid, data.ratios(variant), data.records, strict=True)
        ]
        for r in requests:
            scorer.check(r.final)
        started = time.perf_counter()
        signals = []
        for i in range(0, len(requests), batch_size):
            signals.extend(scorer.score_many(requests[i : i + batch_size]))
        elapsed = time.perf_counter() - started
        p = [s.p_factual for s in signals]
        if any(v is None for v in p):
            raise ConfigError(f"{scorer.version} could not score every recorded answer")
        results.append(
            report(
                scorer,
                [float(v) for v in p if v is not None],
                data.rows.label,
                part=meta.part,
                source=f"recorded:{data_dir}",
                mean_logprob=[float(v) for v in data.rows.logprob],
                extra={
                    "k": meta.k,
                    "data_sha256": data.sha256(),
                    "score_us_per_request": elapsed / max(1, len(requests)) * 1e6,
                },
            )
        )
    return results
