"""NQ-open answer labels and the sklearn-free AUROC."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics import roc_auc_score

from sidecar.exceptions import ConfigError, DataError
from sidecar.lab.answers import is_correct, normalize_answer
from sidecar.stats.metrics import auroc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an  Apple, a day ", "apple day"),
        ("Super Bowl LII,", "super bowl lii"),
        ("1,000 years", "1000 years"),
        ("Theater", "theater"),
    ],
)
def test_normalisation_follows_squad(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_correct_when_a_gold_answer_is_contained() -> None:
    assert is_correct("It was written by the architect Barry Parker.", ["architect Barry Parker"])
    assert is_correct("The answer is 291 episodes", ["291"])
    assert not is_correct("It was published in 1999", ["September 1999"])
    assert not is_correct("anything", ["", "the"])  # empty after normalisation never matches
    assert not is_correct("", ["x"])


@given(
    hnp.arrays(np.float64, 40, elements=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])),
    hnp.arrays(np.int8, 40, elements=st.integers(0, 1)),
)
def test_auroc_matches_sklearn_with_ties(
    scores: npt.NDArray[np.float64], labels: npt.NDArray[np.int8]
) -> None:
    if labels.min() == labels.max():
        with pytest.raises(ConfigError, match="both classes"):
            auroc(scores, labels)
        return
    assert auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auroc_extremes() -> None:
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5], [0, 1]) == 0.5
    with pytest.raises(ConfigError, match="2 scores for 3 labels"):
        auroc([0.1, 0.2], [0, 1, 1])


def test_auroc_refuses_nan_scores() -> None:
    """A NaN sorts last, so it read as the highest score: auroc([nan, 0.2, 0.3], [1, 0, 1])
    was 1.0 without a word (audit)."""
    with pytest.raises(DataError, match="NaN"):
        auroc([math.nan, 0.2, 0.3], [1, 0, 1])


def test_auroc_ties_infinite_scores() -> None:
    """Two -inf scores (a log-probability of 0) are one tie, counted 1/2: pairs (-inf, -inf)
    1/2, (-inf, 0.2) 0, (0.3, -inf) 1, (0.3, 0.2) 1 -> 2.5 / 4 (sklearn refuses inf)."""
    scores, labels = [-math.inf, -math.inf, 0.2, 0.3], [1, 0, 0, 1]
    assert auroc(scores, labels) == pytest.approx(0.625)
