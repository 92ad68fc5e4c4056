"""Ground-truth labels of retrieved chunks for calibration (seed 000, eq. 1).

A retrieved chunk ``c`` of question ``i`` is *affiliated* when its source
document ``d(c)`` is one of the question's gold documents ``d(r_i)``. With a
similarity ``h`` between a chunk and the reference answer (ROUGE-L, see
:mod:`sidecar.lab.conformal.rouge`), eq. (1) sets a global threshold from the
chunks that are *not* affiliated,

    s_thres = P_beta({ h(c_ij, r_i) | d(c_ij) != d(r_i) }),

and a chunk is correct when ``h(c, r) >= s_thres and d(c) = d(r)``. ``P_beta`` is the
beta-quantile with linear interpolation between order statistics (numpy's default),
beta given as a fraction (0.99 is the 99th percentile, the seed's choice for NQ).
beta = 0 means "by document id only" (the seed's choice for RagBench): no ROUGE-L
is computed and a chunk is correct exactly when it is affiliated. With several
reference answers ``h`` is the best ROUGE-L over them. The threshold learnt on
the calibration set is passed back in (``s_thres=``) to label a test set the same way.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sidecar.exceptions import ConfigError, InputError
from sidecar.lab.conformal.rouge import rouge_l_max

if TYPE_CHECKING:
    from sidecar.lab.retrieval.workflow import RetrievalRun

__all__ = ["GroundTruth", "check_beta", "label_chunks", "label_run"]


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """Boolean labels per question and chunk, with the threshold that produced them."""

    labels: tuple[tuple[bool, ...], ...]
    beta: float
    s_thres: float | None
    """The ROUGE-L threshold of eq. (1); ``None`` when beta = 0 (document id only)."""
    n_affiliated: int
    n_correct: int


def check_beta(beta: float) -> float:
    """Validate beta in [0, 1] (a fraction, not a percent); raise :class:`ConfigError` otherwise."""
    if isinstance(beta, bool) or not math.isfinite(beta) or not 0.0 <= beta <= 1.0:
        raise ConfigError(
            f"beta must be a fraction in [0, 1] (0.99 = 99th percentile, 0 = document id only), "
            f"got {beta!r}"
        )
    return float(beta)


def label_chunks(
    doc_ids: Sequence[Sequence[str]],
    gold_doc_ids: Sequence[Collection[str]],
    *,
    beta: float,
    texts: Sequence[Sequence[str]] | None = None,
    references: Sequence[Sequence[str]] | None = None,
    s_thres: float | None = None,
) -> GroundTruth:
    """Label every retrieved chunk of every question per eq. (1).

    ``doc_ids[i][j]`` is the source document of the ``j``-th chunk retrieved for
    question ``i``; ``gold_doc_ids[i]`` its gold documents. For beta > 0 the chunk
    ``texts`` (same shape as ``doc_ids``) and the reference answers per question
    are required; ``s_thres`` reuses a threshold learnt on another set instead
    of computing it from this one.
    """
    b = check_beta(beta)
    if len(gold_doc_ids) != len(doc_ids):
        raise InputError(
            "shape-mismatch",
            f"gold_doc_ids has {len(gold_doc_ids)} questions but doc_ids has {len(doc_ids)}",
        )
    affiliated = [[d in gold for d in row] for row, gold in zip(doc_ids, gold_doc_ids, strict=True)]
    n_aff = sum(sum(row) for row in affiliated)
    if b == 0.0:
        labels = tuple(tuple(row) for row in affiliated)
        return GroundTruth(labels=labels, beta=b, s_thres=None, n_affiliated=n_aff, n_correct=n_aff)

    if texts is None or references is None:
        raise ConfigError("beta > 0 needs the chunk texts and the reference answers (eq. 1)")
    if len(texts) != len(doc_ids) or len(references) != len(doc_ids):
        raise InputError(
            "shape-mismatch",
            f"texts ({len(texts)}) and references ({len(references)}) must have one entry per "
            f"question ({len(doc_ids)})",
        )
    similarity: list[list[float]] = []
    for i, (row_texts, row_ids, refs) in enumerate(zip(texts, doc_ids, references, strict=True)):
        if len(row_texts) != len(row_ids):
            raise InputError(
                "shape-mismatch",
                f"question {i}: {len(row_texts)} chunk texts but {len(row_ids)} doc ids",
            )
        similarity.append([rouge_l_max(t, refs) for t in row_texts])

    if s_thres is None:
        others = [
            h
            for row_h, row_a in zip(similarity, affiliated, strict=True)
            for h, a in zip(row_h, row_a, strict=True)
            if not a
        ]
        # Without any non-affiliated chunk there is nothing to set a floor from: 0 keeps
        # every affiliated chunk (h >= 0 always).
        s_thres = float(np.quantile(np.asarray(others, dtype=np.float64), b)) if others else 0.0
    elif not math.isfinite(s_thres):
        raise ConfigError(f"s_thres must be a finite number, got {s_thres!r}")

    thr = s_thres
    labels = tuple(
        tuple(a and h >= thr for h, a in zip(row_h, row_a, strict=True))
        for row_h, row_a in zip(similarity, affiliated, strict=True)
    )
    n_correct = sum(sum(row) for row in labels)
    return GroundTruth(labels=labels, beta=b, s_thres=thr, n_affiliated=n_aff, n_correct=n_correct)


def label_run(run: RetrievalRun, beta: float, s_thres: float | None = None) -> GroundTruth:
    """Eq. (1) ground truth of every hit of ``run`` (``s_thres`` from calibration: a test set)."""
    return label_chunks(
        run.doc_ids,
        [q.gold_doc_ids for q in run.questions],
        beta=beta,
        texts=run.texts,
        references=[q.answers for q in run.questions],
        s_thres=s_thres,
    )
