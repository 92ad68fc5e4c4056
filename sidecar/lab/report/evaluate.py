"""``guardrail eval report``: every signal and the calibrated confidence on labelled outcomes.

The rows come from the real RAG loop (:mod:`sidecar.lab.report.collect`); their
recorded events are replayed through a processor built as ``guardrail run``
builds it, so the report measures what the sidecar would publish today. It
computes, for detecting wrong answers: the AUROC of every signal and of the
calibrated confidence; ECE, Brier and NLL of the confidence (docs/methods.md
§Calibrated confidence); the allow / caveat / block mix with the error rate in
each bucket; the retrieve-again advice; m1/m2 means against alpha
(docs/methods.md §Retrieval certification); the coverage bound
(docs/methods.md §Coverage bound) against the measured hallucination rate; and the
certified allow: the allow rate, the error among allowed answers with its 95 %
Clopper-Pearson interval against the certified risk the verdicts carry, and the
risk-coverage curve (error among allowed vs allow rate over confidence
thresholds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.confidence.bound import CoverageCounts, coverage_bound
from sidecar.confidence.certify_allow import DEFAULT_GRID
from sidecar.exceptions import DataError
from sidecar.lab.report.collect import process_events, row_events
from sidecar.lab.report.probe import LeakageProbeResult, is_abstention
from sidecar.pipeline.processor import Processor
from sidecar.stats.binomial import clopper_pearson
from sidecar.stats.metrics import auroc, brier, ece, nll, reliability_bins

__all__ = ["Replayed", "build_report", "replay_rows"]

SIGNALS: tuple[tuple[str, str], ...] = (
    ("confidence", "calibrated confidence"),
    ("lookback_p", "lookback p(factual)"),
    ("claims_reliability", "claim reliability"),
    ("m2", "m2 (trusted share)"),
    ("retrieval_top_score", "top retrieval score"),
    ("mean_token_logprob", "mean token log-prob"),
)


@dataclass(frozen=True, slots=True)
class Replayed:
    """One row with the verdict the current processor gives it."""

    row: dict[str, Any]
    verdict: dict[str, Any]
    claims: list[dict[str, Any]]

    @property
    def correct(self) -> bool:
        value = self.row["correct"]
        if not isinstance(value, bool):  # bool("false") is True: never guess a label
            qid = self.row.get("qid")
            raise DataError(f"row {qid!r}: correct must be true or false, got {value!r}")
        return value


def replay_rows(
    rows: Sequence[dict[str, Any]],
    processor_factory: Callable[[], Processor],
    *,
    progress: bool = False,
) -> list[Replayed]:
    """Feed every row's recorded events through one fresh processor, in row order."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    processor = processor_factory()
    out = []
    try:
        for row in tqdm(rows, desc="replay", disable=not progress):
            verdict, claims = process_events(processor, row_events(row))
            if verdict is None:
                raise RuntimeError(f"no verdict for question {row['qid']}")
            out.append(Replayed(row, verdict, claims))
    finally:
        processor.signals.close()
    return out


def _signal_values(r: Replayed) -> dict[str, float | None]:
    values: dict[str, float | None] = dict(r.verdict.get("confidence_features") or {})
    if not values:  # no confidence model: read the signals directly
        sig = r.verdict["signals"]
        hits = r.row["retrieval"]["hits"]
        values = {
            "lookback_p": sig["lookback"].get("p_factual"),
            "claims_reliability": sig["claims"].get("reliability"),
            "m2": sig["retrieval"].get("m2"),
            "retrieval_top_score": max((h["score"] for h in hits), default=None),
            "mean_token_logprob": r.row["final"].get("mean_token_logprob"),
        }
    values["confidence"] = r.verdict.get("confidence")
    return values


def _auroc_or_none(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    if len(set(labels)) < 2:
        return None
    return float(auroc(np.asarray(scores, dtype=np.float64), np.asarray(labels)))


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def _alpha_sweep(
    replayed: Sequence[Replayed], calibration_file: Path | None
) -> list[dict[str, Any]]:
    if calibration_file is None or not calibration_file.exists():
        return []
    from sidecar.conformal.artifact import CalibrationArtifact  # noqa: PLC0415
    from sidecar.conformal.certify import certify  # noqa: PLC0415

    artifact = CalibrationArtifact.loads(calibration_file.read_bytes())
    out = []
    for cal in artifact.sweep_calibrations():
        m1, m2, answer_trusted = [], [], []
        for r in replayed:
            hits = r.row["retrieval"]["hits"]
            cert = certify([h["score"] for h in hits], cal, depth=r.row["retrieval"]["k"])
            m1.append(cert.m1)
            m2.append(cert.m2)
            bearing = [i for i, c in enumerate(r.row["chunks"]) if c["contains_answer"]]
            if bearing:
                answer_trusted.append(any(i in cert.trusted_indices for i in bearing))
        out.append(
            {
                "alpha": float(cal.alpha),
                "m1_mean": float(np.mean(m1)),
                "m2_mean": float(np.mean(m2)),
                "answer_chunk_trusted": float(np.mean(answer_trusted)) if answer_trusted else None,
                "n": len(replayed),
            }
        )
    return out


def _bound(
    replayed: Sequence[Replayed], probe: LeakageProbeResult | None, confidence: float
) -> dict[str, Any]:
    covered = [r for r in replayed if r.verdict["signals"]["retrieval"].get("m1") is True]
    uncovered = [r for r in replayed if r.verdict["signals"]["retrieval"].get("m1") is False]

    def errors(rs: Sequence[Replayed]) -> int:
        return sum(1 for r in rs if not r.correct and not is_abstention(r.row["answer"]))

    counts = CoverageCounts(
        requests=len(covered) + len(uncovered),
        covered=len(covered),
        labelled_covered=len(covered),
        errors_covered=errors(covered),
        labelled_uncovered=len(uncovered),
        errors_uncovered=errors(uncovered),
        probe_trials=probe.trials if probe else 0,
        probe_errors=probe.errors if probe else 0,
    )
    return coverage_bound(counts, confidence=confidence).to_dict()


def _certified_allow(replayed: Sequence[Replayed], confidence: float = 0.95) -> dict[str, Any]:
    """Allow rate, error among allowed (Clopper-Pearson), certified risk, risk-coverage curve."""
    n = len(replayed)
    allowed = [r for r in replayed if r.verdict["decision"] == "allow"]
    wrong = sum(1 for r in allowed if not r.correct)
    low, high = clopper_pearson(wrong, len(allowed), confidence)
    risks = sorted(
        {float(v) for r in replayed if (v := r.verdict.get("certified_risk")) is not None}
    )
    deltas = sorted(
        {float(v) for r in replayed if (v := r.verdict.get("certified_delta")) is not None}
    )
    certified_risk = risks[0] if len(risks) == 1 else None
    within = None
    if certified_risk is not None and allowed:
        # within the certified risk up to the interval: the low end does not exceed it
        within = low <= certified_risk
    curve = []
    scored = [
        (float(p), r.correct) for r in replayed if (p := r.verdict.get("confidence")) is not None
    ]
    for t in DEFAULT_GRID:
        kept = [c for p, c in scored if p >= t]
        if kept:
            errors = sum(1 for c in kept if not c)
            curve.append(
                {
                    "threshold": t,
                    "allow_rate": len(kept) / n,
                    "allowed": len(kept),
                    "error_rate_allowed": errors / len(kept),
                }
            )
    return {
        "allow_rate": len(allowed) / n,
        "allowed": len(allowed),
        "errors_allowed": wrong,
        "error_rate_allowed": wrong / len(allowed) if allowed else None,
        "error_rate_allowed_low": low if allowed else None,
        "error_rate_allowed_high": high if allowed else None,
        "interval": f"Clopper-Pearson {confidence:.0%}",
        "certified_risk": certified_risk,
        "certified_risks": risks,
        "certified_delta": deltas[0] if len(deltas) == 1 else None,
        "certified_answers": sum(
            1 for r in replayed if r.verdict.get("certified_risk") is not None
        ),
        "within_certified_risk": within,
        "risk_coverage": curve,
    }


def build_report(
    replayed: Sequence[Replayed],
    *,
    calibration_file: Path | None = None,
    probe: LeakageProbeResult | None = None,
    bound_confidence: float = 0.95,
    bins: int = 10,
) -> dict[str, Any]:
    """The report's JSON: headline numbers first, then the details behind each plot."""
    if not replayed:
        raise ValueError("no rows to report on")
    correct = [int(r.correct) for r in replayed]
    n = len(replayed)
    values = [_signal_values(r) for r in replayed]
    signals: dict[str, Any] = {}
    for name, title in SIGNALS:
        pairs = [
            (float(x), c)
            for v, c in zip(values, correct, strict=True)
            if (x := v.get(name)) is not None
        ]
        scores = [p for p, _ in pairs]
        labels = [c for _, c in pairs]
        # AUROC of detecting a wrong answer with (higher = more likely wrong) = AUROC of the
        # signal for the correct class: both are P(signal(correct) > signal(wrong)).
        signals[name] = {"title": title, "n": len(pairs), "auroc": _auroc_or_none(scores, labels)}
    calibration = _calibration(values, correct, bins)
    decisions: dict[str, Any] = {}
    for d in ("allow", "caveat", "block"):
        bucket = [r for r in replayed if r.verdict["decision"] == d]
        wrong = sum(1 for r in bucket if not r.correct)
        decisions[d] = {
            "n": len(bucket),
            "share": len(bucket) / n,
            "errors": wrong,
            "error_rate": _rate(wrong, len(bucket)),
        }
    advised = [r for r in replayed if r.verdict.get("advice")]
    not_advised = [r for r in replayed if not r.verdict.get("advice")]
    chunk_scores, chunk_labels = [], []
    for r in replayed:
        bearing = {c["chunk_id"]: c["contains_answer"] for c in r.row["chunks"]}
        for f in r.verdict.get("chunk_forecast") or []:
            chunk_scores.append(float(f["p_useful"]))
            chunk_labels.append(int(bearing.get(f["chunk_id"], False)))
    certified = _certified_allow(replayed)
    abstentions = sum(1 for r in replayed if is_abstention(r.row["answer"]))
    report: dict[str, Any] = {
        "n": n,
        "accuracy": float(np.mean(correct)),
        "allow_rate": certified["allow_rate"],
        "auroc": signals["confidence"]["auroc"],
        "ece": calibration.get("ece"),
        "brier": calibration.get("brier"),
        "nll": calibration.get("nll"),
        # CalibRAG's %NA: the share of answers in which the generator abstained, in percent
        "pct_na": 100.0 * abstentions / n,
        "error_rate_allowed": decisions["allow"]["error_rate"],
        "error_rate_allowed_interval": [
            certified["error_rate_allowed_low"],
            certified["error_rate_allowed_high"],
        ],
        "certified_risk": certified["certified_risk"],
        "block_rate": decisions["block"]["share"],
        "caveat_rate": decisions["caveat"]["share"],
        "signals": signals,
        "calibration": calibration,
        "decisions": decisions,
        "certified_allow": certified,
        "retrieve_again": {
            "advised": len(advised),
            "share": len(advised) / n,
            "accuracy_advised": _rate(sum(r.correct for r in advised), len(advised)),
            "accuracy_not_advised": _rate(sum(r.correct for r in not_advised), len(not_advised)),
            "chunk_forecast_auroc_answer_bearing": _auroc_or_none(chunk_scores, chunk_labels),
            "chunks_forecast": len(chunk_scores),
        },
        "coverage_bound": _bound(replayed, probe, bound_confidence),
        "alpha_sweep": _alpha_sweep(replayed, calibration_file),
        "abstentions": abstentions,
        "model_versions": replayed[0].verdict.get("model_versions", {}),
        "policy": replayed[0].verdict.get("policy"),
    }
    if probe is not None:
        report["leakage_probe"] = probe.to_dict()
    finite: dict[str, Any] = _finite(report)
    return finite


def _calibration(
    values: Sequence[dict[str, float | None]], correct: Sequence[int], bins: int
) -> dict[str, Any]:
    """ECE, Brier, NLL and the reliability bins of the calibrated confidence."""
    conf = [v.get("confidence") for v in values]
    probs = [float(p) for p in conf if p is not None]
    if len(probs) != len(conf):
        return {"available": False}
    p = np.asarray(probs)
    y = np.asarray(correct)
    base = np.full(len(y), float(y.mean()))
    return {
        "available": True,
        "ece": ece(p, y, bins=bins),
        "brier": brier(p, y),
        "nll": nll(p, y),
        "mean_confidence": float(p.mean()),
        "accuracy": float(y.mean()),
        "bins": [_asdict(b) for b in reliability_bins(p, y, bins=bins)],
        "baseline_constant": {"brier": brier(base, y), "nll": nll(base, y)},
    }


def _asdict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


def _finite(obj: Any) -> Any:
    """JSON has no NaN: turn non-finite floats into null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj
