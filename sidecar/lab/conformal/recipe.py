"""The retrieval calibration recipe: questions, corpus, index, labels, q_hat.

The method: docs/methods.md §Retrieval certification.

calibrate: embed and index a corpus (the union of the passages of NQ-open-format
files), retrieve the top K chunks for the calibration questions, label them
(eq. 1), calibrate q_hat globally and per (tenant, collection, retriever)
(eq. 2) and write the versioned calibration artifact with the alpha-sweep of
mean(m1) and mean(m2). Calibration and test questions come from one file through
a deterministic split (:mod:`sidecar.lab.retrieval.split`). The held-out side is
:mod:`sidecar.lab.conformal.evaluate`.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.exceptions import ConfigError
from sidecar.hashing import sha256_file

if TYPE_CHECKING:
    from sidecar.conformal.calibrator import ConformalCalibration
    from sidecar.lab.retrieval.corpus import QARecord
    from sidecar.lab.retrieval.embedder import MiniLMEmbedder
    from sidecar.lab.retrieval.split import Split
    from sidecar.lab.retrieval.workflow import Corpus

__all__ = [
    "CalibrateSpec",
    "RetrievalData",
    "SplitDefaults",
    "calibrate",
    "command_line",
    "spread_of",
]

log = logging.getLogger(__name__)

SPREAD_CONFIDENCE = 0.9  # the central interval of the coverage a calibration's threshold gives
SPREAD_WARN = 0.05  # warn when its lower end is this far below 1 - alpha (n near 100 at 0.1)


@dataclass(frozen=True)
class RetrievalData:
    """Which questions a run retrieves for, from which corpus, and how it embeds and indexes."""

    questions: Path
    corpus: tuple[Path, ...]
    split: Split
    max_questions: int | None
    device: str
    batch_size: int
    threads: int | None
    qdrant_path: Path | None
    qdrant_url: str | None
    progress: bool

    def embedder(self) -> MiniLMEmbedder:
        from sidecar.lab.retrieval.embedder import MiniLMEmbedder  # noqa: PLC0415

        return MiniLMEmbedder(
            device=self.device, batch_size=self.batch_size, num_threads=self.threads
        )

    def questions_of_split(
        self, *, seed: int, cal_fraction: float
    ) -> tuple[list[QARecord], list[QARecord], str]:
        """Every question of the file, those of this run's split, and the file's sha256."""
        from sidecar.lab.retrieval.corpus import load_questions  # noqa: PLC0415
        from sidecar.lab.retrieval.split import select_split  # noqa: PLC0415

        records = load_questions(self.questions)
        chosen = select_split(
            records,
            self.split,
            seed=seed,
            cal_fraction=cal_fraction,
            max_questions=self.max_questions,
        )
        if not chosen:
            raise ConfigError(f"no questions selected from {self.questions} (split={self.split})")
        return records, chosen, sha256_file(self.questions)

    def load_corpus(self, chunk_words: int) -> Corpus:
        from sidecar.lab.retrieval.workflow import load_corpus  # noqa: PLC0415

        corpus = load_corpus(list(self.corpus), chunk_words)
        log.info(
            "corpus: %d passages -> %d chunks of <= %d words from %d file(s)",
            corpus.n_passages,
            len(corpus.chunks),
            chunk_words,
            len(corpus.files),
        )
        return corpus


@dataclass(frozen=True)
class SplitDefaults:
    """Chunking and question split when neither the command nor an artifact names them."""

    chunk_words: int
    split_seed: int
    cal_fraction: float


@dataclass(frozen=True)
class CalibrateSpec:
    """What to calibrate: alpha (exact, as typed), K, eq. (1)'s beta, the Mondrian key."""

    out: Path
    alpha: str
    top_k: int
    beta: float
    chunk_words: int
    split_seed: int
    cal_fraction: float
    tenant: str
    collection: str
    retriever: str
    allow_vacuous: bool = False  # write a calibration with no threshold at alpha (k > n)


def command_line(head: str, options: list[tuple[str, object]]) -> str:
    """The command that reproduces a run, with every resolved option spelled out."""
    parts = head.split()
    for flag, value in options:
        if value is None:
            continue
        if isinstance(value, list | tuple):
            parts.extend([flag, *(str(v) for v in value)])
        else:
            parts.extend([flag, str(value)])
    return shlex.join(parts)


def _reproduce(data: RetrievalData, spec: CalibrateSpec, beta: float) -> str:
    command = command_line(
        "guardrail calibrate retrieval",
        [
            ("--questions", data.questions),
            ("--corpus", list(data.corpus)),
            ("--split", data.split),
            ("--split-seed", spec.split_seed),
            ("--cal-fraction", spec.cal_fraction),
            ("--max-questions", data.max_questions),
            ("--alpha", spec.alpha),
            ("--k", spec.top_k),
            ("--beta", beta),
            ("--chunk-words", spec.chunk_words),
            ("--tenant", spec.tenant),
            ("--collection", spec.collection),
            ("--retriever", spec.retriever),
            ("--out", spec.out),
        ],
    )
    return f"{command} --allow-vacuous" if spec.allow_vacuous else command


def spread_of(g: ConformalCalibration) -> dict[str, list[float]]:
    """``coverage_spread_90`` of a calibration for its summary (nothing when it has no
    threshold), with a warning when its lower end is ``SPREAD_WARN`` below 1 - alpha."""
    spread = g.coverage_spread(SPREAD_CONFIDENCE)
    if spread is None:
        return {}
    if spread[0] < float(1 - g.alpha) - SPREAD_WARN:
        log.warning(
            "a calibration on n=%d correct chunks: the coverage its threshold gives lies, "
            "over calibration sets of this size, between %.3f and %.3f (90%%; "
            "Beta(k, n+1-k)); 1 - alpha = %.3f holds only on average over them. More "
            "labelled retrievals narrow it",
            g.n,
            spread[0],
            spread[1],
            float(1 - g.alpha),
        )
    return {"coverage_spread_90": [spread[0], spread[1]]}


def calibrate(data: RetrievalData, spec: CalibrateSpec) -> dict[str, Any]:
    """Write the calibration artifact to ``spec.out``; return the run's summary."""
    from sidecar.conformal.artifact import Provenance, build_artifact  # noqa: PLC0415
    from sidecar.conformal.calibrator import alpha_sweep, default_alpha_grid  # noqa: PLC0415
    from sidecar.conformal.mondrian import CalibrationKey, MondrianCalibrator  # noqa: PLC0415
    from sidecar.conformal.quantile import as_alpha  # noqa: PLC0415
    from sidecar.conformal.storage import save_artifact  # noqa: PLC0415
    from sidecar.lab.conformal.labels import check_beta, label_run  # noqa: PLC0415
    from sidecar.lab.retrieval.workflow import (  # noqa: PLC0415
        calibration_data_hash,
        open_index,
        retrieve,
    )

    alpha = as_alpha(spec.alpha)
    beta = check_beta(spec.beta)
    if spec.top_k < 1:
        raise ConfigError(f"--k must be >= 1, got {spec.top_k}")
    key = CalibrationKey(spec.tenant, spec.collection, spec.retriever)

    records, questions, questions_sha = data.questions_of_split(
        seed=spec.split_seed, cal_fraction=spec.cal_fraction
    )
    corpus = data.load_corpus(spec.chunk_words)
    embedder = data.embedder()
    index = open_index(
        corpus, embedder, path=data.qdrant_path, url=data.qdrant_url, progress=data.progress
    )
    try:
        run = retrieve(questions, index, embedder, spec.top_k, progress=data.progress)
    finally:
        index.close()
    truth = label_run(run, beta)
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
        top_k=spec.top_k,
        beta=beta,
    )
    artifact = build_artifact(
        mondrian,
        global_key=key,
        embedding_model_id=embedder.model_id,
        data_hash=data_hash,
        beta=beta,
        s_thres=truth.s_thres,
        top_k=spec.top_k,
        chunk_words=spec.chunk_words,
        sweep=sweep,
        provenance=Provenance(
            questions_file=str(data.questions),
            questions_sha256=questions_sha,
            corpus_files=[str(p) for p in data.corpus],
            corpus_sha256=corpus.fingerprint,
            split=data.split,
            split_seed=spec.split_seed,
            cal_fraction=spec.cal_fraction,
            n_questions_total=len(records),
            max_questions=data.max_questions,
            command=_reproduce(data, spec, beta),
        ),
    )
    g = mondrian.global_calibration
    if not g.certifiable and not spec.allow_vacuous:
        none_correct = (
            " None of the retrieved chunks is a correct one: does --corpus hold the questions' "
            "own passages?"
            if g.n == 0
            else ""
        )
        raise ConfigError(
            f"no conformal threshold at alpha={spec.alpha}: {g.explain()}.{none_correct} A "
            "sidecar serving this calibration trusts no chunk. Calibrate on more questions "
            "(--max-questions, --cal-fraction) or a larger alpha, or pass --allow-vacuous to "
            f"write it anyway; nothing was written to {spec.out}"
        )
    path = save_artifact(artifact, spec.out)
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
    summary.update(spread_of(g))
    for entry in artifact.mondrian:
        if entry.fallback_reason is not None:
            log.warning("%s", entry.detail)
    if not g.certifiable:
        log.warning("%s", g.explain())
    return summary
