"""Held-out evaluation of a retrieval calibration: coverage, m1, m2, plot.

The method: docs/methods.md §Retrieval certification.

The same retrieval as :mod:`sidecar.lab.conformal.recipe` for held-out questions,
each certified with :func:`sidecar.conformal.certify.certify` exactly as the sidecar
does it per event: alpha, n_cal, n_test, coverage (share of correct chunks that are
trusted, to compare with eq. 3), mean(m1), mean(m2) and q_hat, and optionally a plot
of mean(m1), mean(m2) against alpha (seed Fig. 4). A split that overlaps the
artifact's calibration questions is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.lab.conformal.recipe import RetrievalData, SplitDefaults

if TYPE_CHECKING:
    from sidecar.conformal.artifact import CalibrationArtifact
    from sidecar.conformal.registry import ResolvedCalibration
    from sidecar.lab.retrieval.corpus import QARecord

__all__ = ["EvalSpec", "evaluate_retrieval", "summary_text"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSpec:
    """Which artifact to evaluate, under which key; ``None`` takes the artifact's own value,
    then ``defaults`` (an artifact without provenance)."""

    calibration: Path
    defaults: SplitDefaults
    chunk_words: int | None
    split_seed: int | None
    cal_fraction: float | None
    tenant: str | None
    collection: str | None
    retriever: str | None
    unknown_collection: Literal["fallback-global", "reject"]
    allow_corpus_mismatch: bool
    plot: Path | None


def _check_disjoint(
    artifact: CalibrationArtifact,
    records: list[QARecord],
    chosen: list[QARecord],
    questions_sha: str,
) -> None:
    from sidecar.lab.retrieval.split import select_split  # noqa: PLC0415

    prov = artifact.provenance
    if prov is None or prov.questions_sha256 != questions_sha:
        return
    cal = select_split(
        records,
        prov.split,
        seed=prov.split_seed,
        cal_fraction=prov.cal_fraction,
        max_questions=prov.max_questions,
    )
    overlap = {r.index for r in cal} & {r.index for r in chosen}
    if overlap:
        raise ConfigError(
            f"{len(overlap)} of the {len(chosen)} evaluation questions were used to calibrate "
            f"{artifact.calibration_id} (split={prov.split}, seed={prov.split_seed}, "
            f"cal_fraction={prov.cal_fraction}); evaluate on --split test with that seed "
            "and fraction, or on other questions"
        )


def _certify_all(
    scores: list[list[float]], labels: Sequence[Sequence[bool]], resolved: ResolvedCalibration
) -> dict[str, Any]:
    """Certify every retrieval with the per-event function and aggregate (eqs. 3-6)."""
    from sidecar.conformal.certify import certify  # noqa: PLC0415

    n_correct = n_correct_trusted = n_clipped = m1_found = n_found = 0
    m1_sum = m2_sum = 0.0
    for row_scores, row_labels in zip(scores, labels, strict=True):
        cert = certify(row_scores, resolved)  # exactly what the sidecar does per event
        trusted = set(cert.trusted_indices)
        n_correct += sum(row_labels)
        n_correct_trusted += sum(1 for j, y in enumerate(row_labels) if y and j in trusted)
        n_clipped += cert.n_clipped
        m1_sum += cert.m1
        m2_sum += cert.m2
        if any(row_labels):
            n_found += 1
            m1_found += cert.m1
    n = len(scores)
    return {
        "n_correct": n_correct,
        "coverage": n_correct_trusted / n_correct if n_correct else None,
        "m1": m1_sum / n if n else None,
        "m2": m2_sum / n if n else None,
        "m1_given_correct_retrieved": m1_found / n_found if n_found else None,
        "n_clipped": n_clipped,
    }


def _test_sweep(
    artifact: CalibrationArtifact, scores: list[list[float]], labels: Sequence[Sequence[bool]]
) -> list[dict[str, Any]]:
    """The artifact's calibration at every alpha of its sweep, applied to the test retrievals."""
    from sidecar.conformal.calibrator import evaluate  # noqa: PLC0415

    rows = []
    for sweep_cal, point in zip(artifact.sweep_calibrations(), artifact.alpha_sweep, strict=True):
        m = evaluate(sweep_cal, scores, labels)
        rows.append(
            {
                "alpha": point.alpha,
                "m1_test": m.m1_mean,
                "m2_test": m.m2_mean,
                "coverage_test": m.coverage,
                "m1_cal": point.m1_mean,
                "m2_cal": point.m2_mean,
            }
        )
    return rows


def evaluate_retrieval(data: RetrievalData, spec: EvalSpec) -> dict[str, Any]:
    """Certify held-out retrievals with ``spec.calibration`` and return the metrics."""
    from sidecar.conformal.registry import CalibrationRegistry  # noqa: PLC0415
    from sidecar.conformal.storage import load_artifact  # noqa: PLC0415
    from sidecar.lab.conformal.labels import label_run  # noqa: PLC0415
    from sidecar.lab.retrieval.workflow import open_index, retrieve  # noqa: PLC0415

    artifact = load_artifact(spec.calibration)
    prov = artifact.provenance
    seed = (
        spec.split_seed
        if spec.split_seed is not None
        else (prov.split_seed if prov else spec.defaults.split_seed)
    )
    cal_fraction = (
        spec.cal_fraction
        if spec.cal_fraction is not None
        else (prov.cal_fraction if prov else spec.defaults.cal_fraction)
    )
    chunk_words = spec.chunk_words or artifact.chunk_words or spec.defaults.chunk_words

    records, questions, questions_sha = data.questions_of_split(
        seed=seed, cal_fraction=cal_fraction
    )
    _check_disjoint(artifact, records, questions, questions_sha)
    corpus = data.load_corpus(chunk_words)
    if prov is not None and corpus.fingerprint != prov.corpus_sha256:
        message = (
            f"the corpus ({len(corpus.chunks)} chunks of <= {chunk_words} words, fingerprint "
            f"{corpus.fingerprint[:12]}) is not the one {artifact.calibration_id} was calibrated "
            f"on (fingerprint {prov.corpus_sha256[:12]}, chunk_words={artifact.chunk_words})"
        )
        if not spec.allow_corpus_mismatch:
            raise ArtifactError(message + "; pass --allow-corpus-mismatch for a transfer study")
        log.warning("%s", message)
    embedder = data.embedder()
    if embedder.model_id != artifact.embedding_model_id:
        raise ArtifactError(
            f"{artifact.calibration_id} was calibrated with {artifact.embedding_model_id}, "
            f"this run embeds with {embedder.model_id}"
        )
    index = open_index(
        corpus, embedder, path=data.qdrant_path, url=data.qdrant_url, progress=data.progress
    )
    try:
        run = retrieve(questions, index, embedder, artifact.top_k, progress=data.progress)
    finally:
        index.close()
    truth = label_run(run, artifact.beta, s_thres=artifact.s_thres)

    registry = CalibrationRegistry(artifact, unknown_collection=spec.unknown_collection)
    resolved = registry.resolve(
        spec.tenant or artifact.tenant,
        spec.collection or artifact.collection,
        spec.retriever or artifact.retriever_id,
    )
    counts = _certify_all(run.scores, truth.labels, resolved)
    cal = resolved.calibration
    lo, hi = cal.coverage_bounds
    result: dict[str, Any] = {
        "calibration_id": resolved.calibration_id,
        "calibration_key": resolved.used_key,
        "fallback_reason": None
        if resolved.fallback_reason is None
        else str(resolved.fallback_reason),
        "alpha": float(cal.alpha),
        "q_hat": cal.q_hat if cal.certifiable else None,
        "threshold": cal.threshold if cal.certifiable else None,
        "certifiable": cal.certifiable,
        "n_cal": cal.n_questions,
        "n_cal_correct": cal.n,
        "n_test": len(questions),
        "n_test_chunks": sum(len(s) for s in run.scores),
        "n_test_correct": counts["n_correct"],
        "coverage": counts["coverage"],
        "coverage_bounds": [lo, hi],
        "m1": counts["m1"],
        "m2": counts["m2"],
        "recall_at_k": run.recall(),
        "m1_given_correct_retrieved": counts["m1_given_correct_retrieved"],
        "n_clipped": counts["n_clipped"],
        "top_k": artifact.top_k,
        "beta": artifact.beta,
        "s_thres": artifact.s_thres,
        "chunk_words": chunk_words,
        "split": data.split,
        "split_seed": seed,
        "cal_fraction": cal_fraction,
        "alpha_sweep": _test_sweep(artifact, run.scores, truth.labels),
    }
    if spec.plot is not None:
        _plot(spec.plot, result, artifact.calibration_id)
        result["plot"] = str(spec.plot)
    return result


def summary_text(result: dict[str, Any]) -> str:
    """Two lines for a person: the key, q_hat and sizes, then coverage against eq. 3's bounds."""
    cov = result["coverage"]
    lo, hi = result["coverage_bounds"]
    return (
        f"{result['calibration_id']} [{result['calibration_key']}] alpha={result['alpha']:g} "
        f"q_hat={result['q_hat']} n_cal={result['n_cal']} n_test={result['n_test']}\n"
        f"coverage={'n/a' if cov is None else f'{cov:.4f}'} "
        f"(eq. 3 bounds [{lo:.4f}, {hi:.4f}])  mean(m1)={result['m1']:.4f}  "
        f"mean(m2)={result['m2']:.4f}  recall@{result['top_k']}={result['recall_at_k']:.4f}"
    )


def _plot(path: Path, result: dict[str, Any], title: str) -> None:
    try:
        import matplotlib as mpl  # noqa: PLC0415

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            "--plot needs matplotlib: pip install 'rag-guardrail-sidecar[train]'"
        ) from exc
    rows = result["alpha_sweep"]
    alphas = [r["alpha"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(alphas, [r["m1_test"] for r in rows], color="C0", label="mean(m1), test")
    ax.plot(alphas, [r["m2_test"] for r in rows], color="C1", label="mean(m2), test")
    ax.plot(alphas, [r["m1_cal"] for r in rows], "--", color="C0", alpha=0.6, label="mean(m1), cal")
    ax.plot(alphas, [r["m2_cal"] for r in rows], "--", color="C1", alpha=0.6, label="mean(m2), cal")
    cov = [r["coverage_test"] for r in rows]
    if all(c is not None for c in cov):
        ax.plot(alphas, cov, color="C2", lw=1, label="coverage of correct chunks, test")
    ax.plot([0, 1], [1, 0], ":", color="grey", label="1 - alpha")
    ax.axvline(result["alpha"], color="grey", lw=0.8, alpha=0.5)
    ax.set_xlabel("alpha")
    ax.set_ylabel("rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title(
        f"{title}\nK={result['top_k']}, n_cal={result['n_cal']}, n_test={result['n_test']}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
