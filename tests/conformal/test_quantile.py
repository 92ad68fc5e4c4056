"""Exact order statistics of the conformal quantile (seed 000, eq. 2)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.conformal.quantile import (
    as_alpha,
    conformal_quantile,
    min_calibration_size,
    order_statistic_rank,
)
from sidecar.exceptions import ConfigError, InputError

TOY = [0.5, 0.1, 0.9, 0.3, 0.7]  # sorted: 0.1 0.3 0.5 0.7 0.9, n = 5


@pytest.mark.parametrize(
    ("alpha", "k", "expected"),
    [
        # k = ceil((5 + 1)(1 - alpha)), worked by hand
        (0.5, 3, 0.5),  # 6 * 0.5 = 3
        (0.2, 5, 0.9),  # 6 * 0.8 = 4.8 -> 5
        (Fraction(1, 6), 5, 0.9),  # 6 * 5/6 = 5 exactly -> 5, not 6
        (0.99, 1, 0.1),  # 6 * 0.01 = 0.06 -> 1: the smallest score
        (0.6, 3, 0.5),  # 6 * 0.4 = 2.4 -> 3
        (0.7, 2, 0.3),  # 6 * 0.3 = 1.8 -> 2
    ],
)
def test_toy_order_statistics(alpha: float | Fraction, k: int, expected: float) -> None:
    q = conformal_quantile(TOY, alpha)
    assert (q.n, q.k) == (5, k)
    assert q.finite
    assert q.q_hat == expected


@pytest.mark.parametrize("alpha", [0.1, 0.15, 1e-9, Fraction(1, 10**12)])
def test_k_greater_than_n_gives_infinite_q_hat(alpha: float | Fraction) -> None:
    # n = 5 needs alpha >= 1/6 for k <= n; all of these are smaller.
    q = conformal_quantile(TOY, alpha)
    assert q.k == 6
    assert q.k > q.n
    assert not q.finite
    assert q.q_hat == math.inf
    assert "nothing can be certified" in q.explain()
    assert "needs n >= " in q.explain()


def test_empty_calibration_set_is_vacuous() -> None:
    q = conformal_quantile([], 0.5)
    assert (q.n, q.k, q.q_hat) == (0, 1, math.inf)


def test_rank_is_exact_where_floats_are_not() -> None:
    # (9 + 1)(1 - 0.7) = 3 exactly; in binary floating point 10 * (1 - 0.7) = 3.0000000000000004.
    assert math.ceil(10 * (1 - 0.7)) == 4  # the trap the Fraction arithmetic avoids
    assert order_statistic_rank(9, 0.7) == 3
    assert order_statistic_rank(9, "0.7") == 3
    assert conformal_quantile(list(range(9)), 0.7).q_hat == 2.0  # the 3rd smallest
    # (99 + 1)(1 - 0.1) = 90 exactly
    assert order_statistic_rank(99, 0.1) == 90
    assert as_alpha(0.1) == Fraction(1, 10)


@pytest.mark.parametrize(
    "bad", [0.0, 1.0, -0.1, 1.5, math.nan, math.inf, "abc", "", True, Fraction(0), 1]
)
def test_invalid_alpha_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"alpha must be"):
        as_alpha(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        conformal_quantile(TOY, bad)  # type: ignore[arg-type]


def test_message_states_the_allowed_range() -> None:
    with pytest.raises(ConfigError, match=r"alpha must be in \(0, 1\), got 1\.5"):
        as_alpha(1.5)


@pytest.mark.parametrize("bad", [[0.1, math.nan], [math.inf], [[0.1, 0.2]]])
def test_invalid_scores_are_input_errors(bad: list[object]) -> None:
    with pytest.raises(InputError) as info:
        conformal_quantile(bad, 0.1)  # type: ignore[arg-type]
    assert info.value.reason == "invalid-score"


@pytest.mark.parametrize("alpha", [0.5, 0.3, 0.2, 0.1, 0.05, 0.01, Fraction(1, 3), Fraction(2, 7)])
def test_min_calibration_size_is_the_boundary(alpha: float | Fraction) -> None:
    n = min_calibration_size(alpha)
    assert order_statistic_rank(n, alpha) <= n
    assert order_statistic_rank(n - 1, alpha) > n - 1


def _reference_quantile(scores: list[int], alpha: Fraction) -> float:
    """Independent definition: the least score q with #{r <= q} >= (n+1)(1-alpha)."""
    need = (len(scores) + 1) * (1 - alpha)
    for q in sorted(set(scores)):
        if sum(1 for r in scores if r <= q) >= need:
            return float(q)
    return math.inf


alphas = st.fractions(min_value=Fraction(1, 1000), max_value=Fraction(999, 1000)).filter(
    lambda a: 0 < a < 1
)


@settings(max_examples=300, deadline=None)
@given(scores=st.lists(st.integers(-50, 50), max_size=60), alpha=alphas)
def test_matches_the_counting_definition(scores: list[int], alpha: Fraction) -> None:
    q = conformal_quantile(scores, alpha)
    assert q.q_hat == _reference_quantile(scores, alpha)


@settings(max_examples=300, deadline=None)
@given(
    scores=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=80),
    a1=alphas,
    a2=alphas,
)
def test_q_hat_is_monotone_in_alpha(scores: list[float], a1: Fraction, a2: Fraction) -> None:
    lo, hi = sorted((a1, a2))
    assert conformal_quantile(scores, hi).q_hat <= conformal_quantile(scores, lo).q_hat


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5000), alpha=alphas)
def test_rank_definition(n: int, alpha: Fraction) -> None:
    k = order_statistic_rank(n, alpha)
    # k is the least integer >= (n+1)(1-alpha)
    assert k >= (n + 1) * (1 - alpha) > k - 1
    assert k >= 1


def test_does_not_depend_on_input_order() -> None:
    rng = np.random.default_rng(7)
    scores = rng.random(101)
    shuffled = rng.permutation(scores)
    assert conformal_quantile(scores, 0.1).q_hat == conformal_quantile(shuffled, 0.1).q_hat
    assert conformal_quantile(scores, 0.1).q_hat == np.sort(scores)[91]  # k = ceil(102*0.9) = 92
