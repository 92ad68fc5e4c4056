"""``guardrail calibrate retrieval`` and ``guardrail eval retrieval`` (seed 000, Sec. 3.2, 4.2).

calibrate: embed and index a corpus (the union of the passages of NQ-open-format
files), retrieve the top K chunks for the calibration questions, label them
(eq. 1), calibrate q_hat globally and per (tenant, collection, retriever)
(eq. 2) and write the versioned calibration artifact with the alpha-sweep of
mean(m1) and mean(m2).

eval: the same retrieval for held-out questions, each certified with
``sidecar.conformal.certify`` exactly as the sidecar does it per event; prints
alpha, n_cal, n_test, coverage (share of correct chunks that are trusted, to
compare with eq. 3), mean(m1), mean(m2) and q_hat, and optionally plots
mean(m1), mean(m2) against alpha (seed Fig. 4).

Calibration and test questions come from one file through a deterministic split
(:mod:`sidecar.lab.retrieval.split`); eval refuses a split that overlaps the
artifact's calibration questions. Heavy imports happen inside the run functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.cli.groups import add_rag_runtime_args, get_group, progress_enabled
from sidecar.exceptions import ArtifactError, ConfigError

if TYPE_CHECKING:
    from sidecar.conformal.artifact import CalibrationArtifact
    from sidecar.conformal.registry import ResolvedCalibration
    from sidecar.lab.retrieval.corpus import QARecord
    from sidecar.lab.retrieval.embedder import MiniLMEmbedder
    from sidecar.lab.retrieval.workflow import Corpus

__all__ = ["register", "run_calibrate", "run_eval"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_WORDS = 64
DEFAULT_TOP_K = 10
DEFAULT_SPLIT_SEED = 0
DEFAULT_CAL_FRACTION = 0.5
DEFAULT_RETRIEVER = "qdrant-minilm-l6"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calibrate retrieval`` and ``eval retrieval``."""
    calibrate = get_group(sub, "calibrate", "Calibrate a guardrail signal on labelled data.")
    p = calibrate.add_parser(
        "retrieval",
        help="Conformal calibration of retrieval scores (q_hat, Mondrian keys, alpha-sweep).",
        description=(
            "Index a corpus in Qdrant, retrieve the top K chunks of the calibration questions, "
            "label them (seed 000 eq. 1) and write the conformal calibration artifact (eq. 2)."
        ),
    )
    _data_args(p, chunk_default=DEFAULT_CHUNK_WORDS, split_default="cal")
    p.add_argument(
        "--alpha", default="0.1", help="significance level in (0, 1), exact (default 0.1)"
    )
    p.add_argument("--k", type=int, default=DEFAULT_TOP_K, dest="top_k", help="retrieval depth K")
    p.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="eq. (1) ROUGE-L percentile as a fraction (0.99); 0 = by document id only",
    )
    p.add_argument("--tenant", default="default", help="Mondrian key: tenant")
    p.add_argument("--collection", default="default", help="Mondrian key: collection")
    p.add_argument("--retriever", default=DEFAULT_RETRIEVER, help="Mondrian key: retriever id")
    p.add_argument("--out", required=True, type=Path, help="artifact path (JSON)")
    p.set_defaults(func=run_calibrate)

    evaluate = get_group(sub, "eval", "Evaluate a guardrail signal on held-out data.")
    e = evaluate.add_parser(
        "retrieval",
        help="Coverage, mean(m1), mean(m2) of a retrieval calibration on held-out questions.",
        description=(
            "Certify the top K chunks of held-out questions with a calibration artifact, as "
            "the sidecar does per event, and report coverage, mean(m1), mean(m2) and q_hat."
        ),
    )
    _data_args(e, chunk_default=None, split_default="test")
    e.add_argument("--calibration", required=True, type=Path, help="calibration artifact")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--plot", type=Path, help="write mean(m1), mean(m2) against alpha (PNG)")
    e.add_argument("--tenant", help="key to certify under (default: the artifact's)")
    e.add_argument("--collection", help="key to certify under (default: the artifact's)")
    e.add_argument("--retriever", help="key to certify under (default: the artifact's)")
    e.add_argument(
        "--unknown-collection",
        choices=["fallback-global", "reject"],
        default="fallback-global",
        help="a collection the artifact never saw: certify with the global calibration "
        "or reject (dead-letter) the event",
    )
    e.add_argument(
        "--allow-corpus-mismatch",
        action="store_true",
        help="evaluate on another corpus than the one calibrated on (a generalisation study)",
    )
    e.set_defaults(func=run_eval)


def _data_args(
    p: argparse.ArgumentParser, *, chunk_default: int | None, split_default: str
) -> None:
    p.add_argument(
        "--questions", required=True, type=Path, help="NQ-open-format questions (.jsonl[.gz])"
    )
    p.add_argument(
        "--corpus",
        required=True,
        nargs="+",
        type=Path,
        help="NQ-open-format files whose passages (union) form the corpus",
    )
    p.add_argument(
        "--chunk-words",
        type=int,
        default=chunk_default,
        help=f"chunk size in words (default {chunk_default or 'from the artifact'})",
    )
    p.add_argument(
        "--split",
        choices=["cal", "test", "all"],
        default=split_default,
        help=f"which part of the deterministic question split to use (default {split_default})",
    )
    p.add_argument(
        "--split-seed",
        type=int,
        default=None,
        help=f"split seed (default {DEFAULT_SPLIT_SEED}; eval: the artifact's)",
    )
    p.add_argument(
        "--cal-fraction",
        type=float,
        default=None,
        help=f"share of questions in the calibration part (default {DEFAULT_CAL_FRACTION}; "
        "eval: the artifact's)",
    )
    p.add_argument("--max-questions", type=int, help="use only the first N questions of the part")
    p.add_argument("--device", default="cpu", help="torch device for the embedder (cpu, cuda)")
    p.add_argument("--batch-size", type=int, default=64, help="embedding batch size")
    add_rag_runtime_args(p)


# ------------------------------------------------------------------ shared steps


def _embedder(args: argparse.Namespace) -> MiniLMEmbedder:
    from sidecar.lab.retrieval.embedder import MiniLMEmbedder  # noqa: PLC0415

    return MiniLMEmbedder(device=args.device, batch_size=args.batch_size, num_threads=args.threads)


def _questions(
    args: argparse.Namespace, *, seed: int, cal_fraction: float
) -> tuple[list[QARecord], list[QARecord], str]:
    from sidecar.lab.retrieval.corpus import load_questions, sha256_file  # noqa: PLC0415
    from sidecar.lab.retrieval.split import select_split  # noqa: PLC0415

    records = load_questions(args.questions)
    chosen = select_split(
        records,
        args.split,
        seed=seed,
        cal_fraction=cal_fraction,
        max_questions=args.max_questions,
    )
    if not chosen:
        raise ConfigError(f"no questions selected from {args.questions} (split={args.split})")
    return records, chosen, sha256_file(args.questions)


def _corpus(args: argparse.Namespace, chunk_words: int) -> Corpus:
    from sidecar.lab.retrieval.workflow import load_corpus  # noqa: PLC0415

    corpus = load_corpus(args.corpus, chunk_words)
    log.info(
        "corpus: %d passages -> %d chunks of <= %d words from %d file(s)",
        corpus.n_passages,
        len(corpus.chunks),
        chunk_words,
        len(corpus.files),
    )
    return corpus


def _write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _command_line(head: str, options: list[tuple[str, object]]) -> str:
    """The command that reproduces a run, with every resolved option spelled out."""
    parts = head.split()
    for flag, value in options:
        if value is None:
            continue
        if isinstance(value, list):
            parts.extend([flag, *(str(v) for v in value)])
        else:
            parts.extend([flag, str(value)])
    return shlex.join(parts)


# ------------------------------------------------------------------ calibrate


def run_calibrate(args: argparse.Namespace) -> int:
    """``guardrail calibrate retrieval``: write the calibration artifact."""
    from sidecar.conformal.artifact import Provenance, build_artifact  # noqa: PLC0415
    from sidecar.conformal.calibrator import alpha_sweep, default_alpha_grid  # noqa: PLC0415
    from sidecar.conformal.mondrian import CalibrationKey, MondrianCalibrator  # noqa: PLC0415
    from sidecar.conformal.quantile import as_alpha  # noqa: PLC0415
    from sidecar.conformal.storage import save_artifact  # noqa: PLC0415
    from sidecar.lab.conformal.labels import check_beta  # noqa: PLC0415
    from sidecar.lab.retrieval.workflow import (  # noqa: PLC0415
        calibration_data_hash,
        open_index,
        retrieve,
    )

    alpha = as_alpha(args.alpha)
    beta = check_beta(args.beta)
    if args.top_k < 1:
        raise ConfigError(f"--k must be >= 1, got {args.top_k}")
    seed = DEFAULT_SPLIT_SEED if args.split_seed is None else args.split_seed
    cal_fraction = DEFAULT_CAL_FRACTION if args.cal_fraction is None else args.cal_fraction
    key = CalibrationKey(args.tenant, args.collection, args.retriever)
    progress = progress_enabled(args)

    records, questions, questions_sha = _questions(args, seed=seed, cal_fraction=cal_fraction)
    corpus = _corpus(args, args.chunk_words)
    embedder = _embedder(args)
    index = open_index(
        corpus, embedder, path=args.qdrant_path, url=args.qdrant_url, progress=progress
    )
    try:
        run = retrieve(questions, index, embedder, args.top_k, progress=progress)
    finally:
        index.close()
    truth = run.labels(beta)
    scores = run.scores
    keys = [key] * len(scores)
    mondrian = (
        MondrianCalibrator(alpha).fit(scores, keys).calibrate(scores, truth.labels, keys)
    ).calibration_
    sweep = alpha_sweep(scores, truth.labels, default_alpha_grid())
    data_hash = calibration_data_hash(
        questions_sha256=questions_sha,
        question_indices=[q.index for q in questions],
        corpus=corpus,
        embedding_model_id=embedder.model_id,
        top_k=args.top_k,
        beta=beta,
    )
    command = _command_line(
        "guardrail calibrate retrieval",
        [
            ("--questions", args.questions),
            ("--corpus", list(args.corpus)),
            ("--split", args.split),
            ("--split-seed", seed),
            ("--cal-fraction", cal_fraction),
            ("--max-questions", args.max_questions),
            ("--alpha", args.alpha),
            ("--k", args.top_k),
            ("--beta", beta),
            ("--chunk-words", args.chunk_words),
            ("--tenant", args.tenant),
            ("--collection", args.collection),
            ("--retriever", args.retriever),
            ("--out", args.out),
        ],
    )
    artifact = build_artifact(
        mondrian,
        global_key=key,
        embedding_model_id=embedder.model_id,
        data_hash=data_hash,
        beta=beta,
        s_thres=truth.s_thres,
        top_k=args.top_k,
        chunk_words=args.chunk_words,
        sweep=sweep,
        provenance=Provenance(
            questions_file=str(args.questions),
            questions_sha256=questions_sha,
            corpus_files=[str(p) for p in args.corpus],
            corpus_sha256=corpus.fingerprint,
            split=args.split,
            split_seed=seed,
            cal_fraction=cal_fraction,
            n_questions_total=len(records),
            max_questions=args.max_questions,
            command=command,
        ),
    )
    path = save_artifact(artifact, args.out)
    g = mondrian.global_calibration
    at_alpha = next(p for p in sweep if p.alpha == alpha) if alpha in default_alpha_grid() else None
    summary: dict[str, Any] = {
        "artifact": str(path),
        "calibration_id": artifact.calibration_id,
        "alpha": float(alpha),
        "n_cal": g.n_questions,
        "n": g.n,
        "k": g.k,
        "q_hat": artifact.q_hat,
        "certifiable": g.certifiable,
        "explain": g.explain(),
        "n1": g.n1,
        "n2": g.n2,
        "beta": beta,
        "s_thres": truth.s_thres,
        "recall_at_k": run.recall(),
        "n_chunks": len(corpus.chunks),
    }
    if at_alpha is not None:
        summary.update(m1_cal=at_alpha.m1_mean, m2_cal=at_alpha.m2_mean)
    for entry in artifact.mondrian:
        if entry.fallback_reason is not None:
            log.warning("%s", entry.detail)
    if not g.certifiable:
        log.warning("%s", g.explain())
    _write(json.dumps(summary))
    return 0


# ------------------------------------------------------------------ eval


def _check_disjoint(
    args: argparse.Namespace,
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


def run_eval(args: argparse.Namespace) -> int:
    """``guardrail eval retrieval``: certify held-out retrievals and report the metrics."""
    from sidecar.conformal.registry import CalibrationRegistry  # noqa: PLC0415
    from sidecar.conformal.storage import load_artifact  # noqa: PLC0415
    from sidecar.lab.retrieval.workflow import open_index, retrieve  # noqa: PLC0415

    artifact = load_artifact(args.calibration)
    prov = artifact.provenance
    seed = (
        args.split_seed
        if args.split_seed is not None
        else (prov.split_seed if prov else DEFAULT_SPLIT_SEED)
    )
    cal_fraction = (
        args.cal_fraction
        if args.cal_fraction is not None
        else (prov.cal_fraction if prov else DEFAULT_CAL_FRACTION)
    )
    chunk_words = args.chunk_words or artifact.chunk_words or DEFAULT_CHUNK_WORDS
    progress = progress_enabled(args)

    records, questions, questions_sha = _questions(args, seed=seed, cal_fraction=cal_fraction)
    _check_disjoint(args, artifact, records, questions, questions_sha)
    corpus = _corpus(args, chunk_words)
    if prov is not None and corpus.fingerprint != prov.corpus_sha256:
        message = (
            f"the corpus ({len(corpus.chunks)} chunks of <= {chunk_words} words, fingerprint "
            f"{corpus.fingerprint[:12]}) is not the one {artifact.calibration_id} was calibrated "
            f"on (fingerprint {prov.corpus_sha256[:12]}, chunk_words={artifact.chunk_words})"
        )
        if not args.allow_corpus_mismatch:
            raise ArtifactError(message + "; pass --allow-corpus-mismatch for a transfer study")
        log.warning("%s", message)
    embedder = _embedder(args)
    if embedder.model_id != artifact.embedding_model_id:
        raise ArtifactError(
            f"{artifact.calibration_id} was calibrated with {artifact.embedding_model_id}, "
            f"this run embeds with {embedder.model_id}"
        )
    index = open_index(
        corpus, embedder, path=args.qdrant_path, url=args.qdrant_url, progress=progress
    )
    try:
        run = retrieve(questions, index, embedder, artifact.top_k, progress=progress)
    finally:
        index.close()
    truth = run.labels(artifact.beta, s_thres=artifact.s_thres)

    registry = CalibrationRegistry(artifact, unknown_collection=args.unknown_collection)
    resolved = registry.resolve(
        args.tenant or artifact.tenant,
        args.collection or artifact.collection,
        args.retriever or artifact.retriever_id,
    )
    counts = _certify_all(run.scores, truth.labels, resolved)
    n_test = len(questions)
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
        "n_test": n_test,
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
        "split": args.split,
        "split_seed": seed,
        "cal_fraction": cal_fraction,
        "alpha_sweep": _test_sweep(artifact, run.scores, truth.labels),
    }
    if args.plot is not None:
        _plot(args.plot, result, artifact.calibration_id)
        result["plot"] = str(args.plot)
    if args.json:
        _write(json.dumps(result))
    else:
        cov = result["coverage"]
        _write(
            f"{resolved.calibration_id} [{resolved.used_key}] alpha={result['alpha']:g} "
            f"q_hat={result['q_hat']} n_cal={result['n_cal']} n_test={n_test}\n"
            f"coverage={'n/a' if cov is None else f'{cov:.4f}'} "
            f"(eq. 3 bounds [{lo:.4f}, {hi:.4f}])  mean(m1)={result['m1']:.4f}  "
            f"mean(m2)={result['m2']:.4f}  recall@{artifact.top_k}={result['recall_at_k']:.4f}"
        )
    return 0


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
