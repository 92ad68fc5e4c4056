"""Factories for synthetic retrieval scores (exchangeable by construction)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest


@dataclass(frozen=True)
class Retrievals:
    """Raw scores and correctness labels, one row of K chunks per question."""

    scores: list[list[float]]
    labels: list[list[bool]]

    def take(self, rows: np.ndarray) -> Retrievals:
        return Retrievals([self.scores[i] for i in rows], [self.labels[i] for i in rows])


SyntheticFactory = Callable[..., Retrievals]


def synthetic(
    rng: np.random.Generator,
    n_questions: int,
    *,
    k: int = 5,
    correct_per_question: int = 1,
    correct_mean: float = 0.7,
    wrong_mean: float = 0.4,
    sd: float = 0.1,
) -> Retrievals:
    """i.i.d. questions; each has ``correct_per_question`` correct chunks among ``k``.

    Scores are continuous (normal), correct ones drawn from one distribution and
    incorrect ones from another, independently: the correct chunks' scores are
    i.i.d., hence exchangeable between calibration and test.
    """
    scores = rng.normal(wrong_mean, sd, size=(n_questions, k))
    scores[:, :correct_per_question] = rng.normal(
        correct_mean, sd, size=(n_questions, correct_per_question)
    )
    labels = np.zeros((n_questions, k), dtype=bool)
    labels[:, :correct_per_question] = True
    # present each row best-first, as a retriever would
    order = np.argsort(-scores, axis=1)
    scores = np.take_along_axis(scores, order, axis=1)
    labels = np.take_along_axis(labels, order, axis=1)
    return Retrievals(scores.tolist(), labels.tolist())


@pytest.fixture
def make_retrievals() -> SyntheticFactory:
    def make(seed: int = 0, n_questions: int = 200, **kwargs: float) -> Retrievals:
        return synthetic(np.random.default_rng(seed), n_questions, **kwargs)  # type: ignore[arg-type]

    return make
