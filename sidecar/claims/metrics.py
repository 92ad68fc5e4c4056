"""Binary detection metrics without scikit-learn: AUROC, accuracy, F1, ECE.

Used by verifier training (model card numbers), ``guardrail eval claims`` and
the length-artefact check (the AUROC of answer length alone, which must be
near 0.5 on a fair evaluation set; the data README measures 0.95 on raw
HaluEval QA). Pure functions on sequences of floats and 0/1 labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BinaryReport",
    "auroc",
    "balanced_accuracy",
    "binary_report",
    "expected_calibration_error",
]


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve (Mann-Whitney U with mid-ranks for ties).

    ``labels`` are 1 for the positive class; higher scores should mean
    positive. NaN when one class is absent.
    """
    if len(scores) != len(labels):
        raise ValueError(f"scores ({len(scores)}) and labels ({len(labels)}) differ in length")
    pos = sum(1 for y in labels if y == 1)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return math.nan
    order = sorted(range(len(scores)), key=lambda k: scores[k])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        mid = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = mid
        i = j + 1
    rank_sum = sum(r for r, y in zip(ranks, labels, strict=True) if y == 1)
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def expected_calibration_error(
    probs: Sequence[float], labels: Sequence[int], bins: int = 10
) -> float:
    """ECE with equal-width bins: sum over bins of |accuracy - confidence| weighted by size."""
    if not probs:
        return math.nan
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [k for k, p in enumerate(probs) if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if not idx:
            continue
        conf = sum(probs[k] for k in idx) / len(idx)
        acc = sum(labels[k] for k in idx) / len(idx)
        total += len(idx) / len(probs) * abs(acc - conf)
    return total


@dataclass(frozen=True, slots=True)
class BinaryReport:
    n: int
    positives: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    auroc: float
    threshold: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "n": self.n,
            "positives": self.positives,
            "accuracy": round(self.accuracy, 4),
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "f1": round(self.f1, 4),
            "auroc": round(self.auroc, 4),
            "threshold": self.threshold,
        }


def binary_report(
    scores: Sequence[float], labels: Sequence[int], threshold: float = 0.5
) -> BinaryReport:
    """Accuracy / precision / recall / F1 at ``threshold`` (score >= threshold is positive)."""
    pred = [1 if s >= threshold else 0 for s in scores]
    tp = sum(1 for p, y in zip(pred, labels, strict=True) if p == 1 and y == 1)
    fp = sum(1 for p, y in zip(pred, labels, strict=True) if p == 1 and y == 0)
    fn = sum(1 for p, y in zip(pred, labels, strict=True) if p == 0 and y == 1)
    n = len(labels)
    correct = sum(1 for p, y in zip(pred, labels, strict=True) if p == y)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return BinaryReport(
        n=n,
        positives=sum(labels),
        accuracy=correct / n if n else math.nan,
        precision=precision,
        recall=recall,
        f1=f1,
        auroc=auroc(scores, labels),
        threshold=threshold,
    )


def balanced_accuracy(scores: Sequence[float], labels: Sequence[int], threshold: float) -> float:
    """Mean of the recall of each class at ``threshold`` (score >= threshold is positive).

    Unlike accuracy it does not reward always answering the majority class;
    NaN when one class is absent.
    """
    if len(scores) != len(labels):
        raise ValueError(f"scores ({len(scores)}) and labels ({len(labels)}) differ in length")
    pos = [s >= threshold for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s < threshold for s, y in zip(scores, labels, strict=True) if y != 1]
    if not pos or not neg:
        return math.nan
    return (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2.0
