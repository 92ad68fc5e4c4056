"""``guardrail eval report``: every signal and the calibrated confidence on labelled outcomes.

The rows come from the real RAG loop (:mod:`sidecar.lab.report.collect`); their
recorded events are replayed through a processor built as ``guardrail run``
builds it, so the report measures what the sidecar would publish today. It
computes, for detecting wrong answers: the AUROC of every signal and of the
calibrated confidence; ECE, Brier and NLL of the confidence (seed 004,
appendix A.3.1); the allow / caveat / block mix with the error rate in each
bucket; the retrieve-again advice; m1/m2 means against alpha (seed 000); the
coverage bound of seed 003 against the measured hallucination rate; and the
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
from sidecar.lab.report.collect import process_events, row_events
from sidecar.lab.report.probe import LeakageProbeResult, is_abstention
from sidecar.pipeline.processor import Processor
from sidecar.stats.binomial import clopper_pearson
from sidecar.stats.metrics import auroc, brier, ece, nll, reliability_bins

__all__ = ["Replayed", "build_report", "replay_rows", "write_plots"]

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
        return bool(self.row["correct"])


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
    for row in tqdm(rows, desc="replay", disable=not progress):
        verdict, claims = process_events(processor, row_events(row))
        if verdict is None:
            raise RuntimeError(f"no verdict for question {row['qid']}")
        out.append(Replayed(row, verdict, claims))
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
    report: dict[str, Any] = {
        "n": n,
        "accuracy": float(np.mean(correct)),
        "allow_rate": certified["allow_rate"],
        "auroc": signals["confidence"]["auroc"],
        "ece": calibration.get("ece"),
        "brier": calibration.get("brier"),
        "nll": calibration.get("nll"),
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
        "abstentions": sum(1 for r in replayed if is_abstention(r.row["answer"])),
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


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """PNG plots of the report into ``out``; returns the files written."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, plot in (
        ("reliability.png", _plot_reliability),
        ("risk_coverage.png", _plot_risk_coverage),
        ("auroc.png", _plot_auroc),
        ("decisions.png", _plot_decisions),
        ("alpha_sweep.png", _plot_alpha_sweep),
        ("coverage_bound.png", _plot_bound),
    ):
        fig = plot(plt, report)
        if fig is None:
            continue
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
    return written


def _plot_reliability(plt: Any, report: dict[str, Any]) -> Any:
    cal = report["calibration"]
    if not cal.get("available"):
        return None
    fig, (ax, hx) = plt.subplots(
        2, 1, figsize=(5.5, 6.5), gridspec_kw={"height_ratios": [3, 1]}, sharex=True
    )
    used = [b for b in cal["bins"] if b["count"]]
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect calibration")
    ax.plot(
        [b["mean_confidence"] for b in used],
        [b["accuracy"] for b in used],
        "o-",
        label="calibrated confidence",
    )
    ax.set_ylabel("accuracy in bin")
    ax.set_title(
        f"Reliability (n={report['n']}): ECE {cal['ece']:.3f}, Brier {cal['brier']:.3f}, "
        f"NLL {cal['nll']:.3f}",
        fontsize=9,
    )
    ax.legend(loc="upper left", fontsize=8)
    hx.bar(
        [(b["lower"] + b["upper"]) / 2 for b in cal["bins"]],
        [b["count"] for b in cal["bins"]],
        width=[b["upper"] - b["lower"] for b in cal["bins"]],
        edgecolor="black",
    )
    hx.set_xlabel("predicted probability of a correct answer")
    hx.set_ylabel("answers")
    return fig


def _plot_risk_coverage(plt: Any, report: dict[str, Any]) -> Any:
    """Error among allowed vs allow rate over confidence thresholds; the policy's point marked."""
    cert = report["certified_allow"]
    curve = cert["risk_coverage"]
    if not curve:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    ax.plot(
        [c["allow_rate"] for c in curve],
        [c["error_rate_allowed"] for c in curve],
        "-",
        label="allow when confidence >= t",
    )
    if cert["certified_risk"] is not None:
        ax.axhline(
            cert["certified_risk"],
            ls="--",
            c="tab:red",
            lw=1,
            label=f"certified risk {cert['certified_risk']:g} (delta {cert['certified_delta']:g})",
        )
    if cert["error_rate_allowed"] is not None:
        err = cert["error_rate_allowed"]
        ax.errorbar(
            [cert["allow_rate"]],
            [err],
            yerr=[[err - cert["error_rate_allowed_low"]], [cert["error_rate_allowed_high"] - err]],
            fmt="o",
            c="tab:red",
            capsize=5,
            label=f"policy's allows ({cert['allowed']}), {cert['interval']}",
        )
    ax.set_xlabel("allow rate")
    ax.set_ylabel("error among allowed answers")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"Risk-coverage (n={report['n']})", fontsize=9)
    return fig


def _plot_auroc(plt: Any, report: dict[str, Any]) -> Any:
    named = [
        (v["title"], v["auroc"], v["n"])
        for v in report["signals"].values()
        if v["auroc"] is not None
    ]
    if not named:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    ax.barh([f"{t} (n={k})" for t, _, k in named], [a for _, a, _ in named])
    ax.axvline(0.5, ls="--", c="grey", lw=1)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("AUROC for detecting wrong answers")
    for i, (_, a, _) in enumerate(named):
        ax.text(a + 0.01, i, f"{a:.3f}", va="center", fontsize=8)
    return fig


def _plot_decisions(plt: Any, report: dict[str, Any]) -> Any:
    dec = report["decisions"]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    names = list(dec)
    ax.bar(names, [dec[d]["n"] for d in names], color=["tab:green", "tab:orange", "tab:red"])
    for i, d in enumerate(names):
        er = dec[d]["error_rate"]
        ax.text(i, dec[d]["n"], "" if er is None else f"error {er:.2f}", ha="center", va="bottom")
    ax.set_ylabel("answers")
    ax.set_title("Decisions and the share of wrong answers in each", fontsize=9)
    return fig


def _plot_alpha_sweep(plt: Any, report: dict[str, Any]) -> Any:
    sweep = report["alpha_sweep"]
    if not sweep:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    alphas = [p["alpha"] for p in sweep]
    ax.plot(alphas, [p["m1_mean"] for p in sweep], "o-", label="mean m1")
    ax.plot(alphas, [p["m2_mean"] for p in sweep], "s-", label="mean m2")
    if all(p["answer_chunk_trusted"] is not None for p in sweep):
        ax.plot(
            alphas,
            [p["answer_chunk_trusted"] for p in sweep],
            "^-",
            label="answer-bearing chunk trusted",
        )
    ax.plot(alphas, [1 - a for a in alphas], ls="--", c="grey", label="1 - alpha")
    ax.set_xlabel("alpha")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.set_title(f"Certification vs alpha on the report's questions (n={report['n']})", fontsize=9)
    return fig


def _plot_bound(plt: Any, report: dict[str, Any]) -> Any:
    b = report["coverage_bound"]
    if b.get("bound") is None:
        return None
    fig, ax = plt.subplots(figsize=(5.0, 3.8))
    ax.errorbar(
        [0],
        [b["bound"]],
        yerr=[[b["bound"] - b["bound_low"]], [b["bound_high"] - b["bound"]]],
        fmt="o",
        capsize=6,
        label="bound c*eps + (1-c)*delta",
    )
    meas = b["measured"]
    if meas["estimate"] is not None:
        ax.errorbar(
            [1],
            [meas["estimate"]],
            yerr=[[meas["estimate"] - meas["low"]], [meas["high"] - meas["estimate"]]],
            fmt="s",
            capsize=6,
            c="tab:red",
            label="measured hallucination rate",
        )
    ax.set_xticks([0, 1], ["bound", "measured"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(0, 1)
    ax.set_title(
        f"Coverage bound ({b['status']}): c={b['coverage']['estimate']:.2f}, "
        f"delta from {b['delta_source']}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper right")
    return fig
