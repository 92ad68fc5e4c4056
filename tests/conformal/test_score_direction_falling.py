"""A hit list whose first pair falls is read as not rising at once, as the full reading has it.

``score_direction`` answers -1 for a list whose first score is above its second
(a similarity retriever's usual list) without its min, max and pairwise scan.
``_reference`` is the function as it was; over drawn lists (ties, NaN, infinities,
signed zeros, one or no hit) the two answer the same.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.conformal.order import score_direction


def _reference(scores: Sequence[float]) -> int | None:
    if len(scores) < 2 or min(scores) == max(scores):
        return None
    rising = all(a <= b for a, b in itertools.pairwise(scores))
    return 1 if rising else -1


_SCORE = st.sampled_from([0.0, -0.0, 0.5, 1.0, math.inf, -math.inf, math.nan]) | st.floats(
    allow_nan=True, allow_infinity=True
)


@settings(max_examples=3000, deadline=None)
@given(st.lists(_SCORE, max_size=6))
def test_the_first_pair_reads_as_the_whole_list_did(scores: list[float]) -> None:
    assert score_direction(scores) == _reference(scores)


def test_lists_the_first_pair_does_not_decide() -> None:
    for scores in (
        [0.9, 0.5, 0.7],  # falls first: -1 at once
        [0.5, 0.5, 0.9],  # a tie first, then a rise: rising (a distance retriever's list)
        [0.5, 0.5, 0.5],  # all equal: not telling
        [math.nan, 0.4, 0.3],  # NaN first: read in full
        [0.4, math.nan, 0.3],
        [0.3, 0.4],
        [0.3],
        [],
    ):
        assert score_direction(scores) == _reference(scores), scores
