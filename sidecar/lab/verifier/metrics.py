"""The verifier's report metrics: accuracy, F1, balanced accuracy; AUROC and ECE, NaN-tolerant.

AUROC and ECE themselves are :mod:`sidecar.stats.metrics`'s. Used by verifier training
(model card numbers), ``guardrail eval claims`` and the length-artefact check (the AUROC
of answer length alone, which must be near 0.5 on a fair evaluation set; the data README
measures 0.95 on raw HaluEval QA). Pure functions on sequences of floats and 0/1 labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.stats.metrics import auroc, ece

__all__ = [
    "BinaryReport",
    "auroc_or_nan",
    "balanced_accuracy",
    "binary_report",
    "ece_or_nan",
]


def auroc_or_nan(scores: Sequence[float], labels: Sequence[int]) -> float:
    """:func:`sidecar.stats.metrics.auroc`, NaN when one class is absent (a report row stays)."""
    if len(scores) != len(labels):
        raise ValueError(f"scores ({len(scores)}) and labels ({len(labels)}) differ in length")
    positives = sum(1 for y in labels if y == 1)
    if positives in (0, len(labels)):
        return math.nan
    return auroc(scores, [y == 1 for y in labels])


def ece_or_nan(probs: Sequence[float], labels: Sequence[int], bins: int = 10) -> float:
    """:func:`sidecar.stats.metrics.ece` over equal-width bins, NaN for no forecasts."""
    return ece(probs, labels, bins) if len(probs) else math.nan


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
        auroc=auroc_or_nan(scores, labels),
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
