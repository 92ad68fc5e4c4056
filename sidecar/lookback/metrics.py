"""AUROC without scikit-learn (the eval command runs on the serving dependencies)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ConfigError

__all__ = ["auroc"]


def auroc(scores: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties count 1/2.

    Mann-Whitney U over average ranks. Raises ``ConfigError`` unless both classes occur.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    if s.shape != y.shape:
        raise ConfigError(f"{s.shape[0]} scores for {y.shape[0]} labels")
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise ConfigError(f"AUROC needs both classes, got {n_pos} positives and {n_neg} negatives")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # Average ranks (1-based) over runs of tied scores.
    boundaries = np.flatnonzero(np.diff(sorted_s)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [s.size]))
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + 1 + end) / 2.0
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))
