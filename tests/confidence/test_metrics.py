"""ECE, Brier and NLL against hand-computed values; input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.confidence.errors import ConfidenceDataError
from sidecar.exceptions import ConfigError
from sidecar.stats.metrics import brier, ece, nll, reliability_bins

# Six forecasts over five bins of width 0.2; bins [0.2, 0.4) and [0.4, 0.6) stay empty
# and p = 1.0 lands in the last bin [0.8, 1.0].
PROBS = [0.05, 0.15, 0.18, 0.62, 0.68, 1.0]
LABELS = [0, 0, 1, 1, 0, 1]


def test_ece_by_hand() -> None:
    # bin [0, .2):  conf = (.05 + .15 + .18)/3 = .38/3, acc = 1/3, |diff| = .62/3, weight 3/6
    # bin [.6, .8): conf = (.62 + .68)/2 = .65,        acc = 1/2, |diff| = .15,   weight 2/6
    # bin [.8, 1]:  conf = 1.0,                         acc = 1,   |diff| = 0,     weight 1/6
    # ECE = 3/6 * .62/3 + 2/6 * .15 + 0 = .31/3 + .05 = .46/3 = 0.153333...
    assert ece(PROBS, LABELS, bins=5) == pytest.approx(0.46 / 3, abs=1e-12)


def test_reliability_bins_by_hand() -> None:
    table = reliability_bins(PROBS, LABELS, bins=5)
    assert [b.count for b in table] == [3, 0, 0, 2, 1]
    assert [(b.lower, b.upper) for b in table][3] == pytest.approx((0.6, 0.8))
    assert table[0].mean_confidence == pytest.approx(0.38 / 3)
    assert table[0].accuracy == pytest.approx(1 / 3)
    assert table[1].mean_confidence is None and table[1].accuracy is None
    assert table[4].mean_confidence == 1.0 and table[4].accuracy == 1.0


def test_probability_one_goes_in_the_last_bin() -> None:
    # One forecast p = 1 with y = 0: bin 9 of 10, |0 - 1| * 1/1 = 1.
    assert ece([1.0], [0]) == 1.0
    assert [b.count for b in reliability_bins([1.0], [0])][-1] == 1
    # p = 0.2 with 5 bins is the lower edge of bin 1, not the upper edge of bin 0.
    assert [b.count for b in reliability_bins([0.2], [1], bins=5)] == [0, 1, 0, 0, 0]


def test_brier_by_hand() -> None:
    # (.05)^2 + (.15)^2 + (.18 - 1)^2 + (.62 - 1)^2 + (.68)^2 + 0
    # = .0025 + .0225 + .6724 + .1444 + .4624 = 1.3042; / 6 = 0.2173666...
    assert brier(PROBS, LABELS) == pytest.approx(1.3042 / 6, abs=1e-12)


def test_nll_by_hand() -> None:
    # -(log .95 + log .85 + log .18 + log .62 + log .32 + log(1 - 1e-12)) / 6
    # = (.051293 + .162519 + 1.714798 + .478036 + 1.139434 + 1e-12) / 6 = 0.591013...
    expected = -sum(math.log(v) for v in (0.95, 0.85, 0.18, 0.62, 0.32, 1 - 1e-12)) / 6
    assert nll(PROBS, LABELS) == pytest.approx(expected, abs=1e-12)
    assert nll(PROBS, LABELS) == pytest.approx(0.591013, abs=1e-6)


def test_nll_clips_confident_misses() -> None:
    # p = 0 for a positive costs -log(1e-12) = 27.631..., not infinity.
    assert nll([0.0], [1]) == pytest.approx(-math.log(1e-12))
    assert nll([0.0], [1], eps=1e-4) == pytest.approx(-math.log(1e-4))


def test_perfect_forecasts() -> None:
    assert ece([0.0, 1.0], [0, 1]) == 0.0
    assert brier([0.0, 1.0], [False, True]) == 0.0


@pytest.mark.parametrize(
    ("probs", "labels", "message"),
    [
        ([0.1, 0.2], [1], "lengths must match"),
        ([], [], "must not be empty"),
        ([0.1, 1.5], [0, 1], r"in \[0, 1\]"),
        ([-0.1], [0], r"in \[0, 1\]"),
        ([0.1, math.nan], [0, 1], "finite"),
        ([0.1, 0.2], [0, 2], "0 or 1"),
        ([0.1], ["yes"], "0 or 1"),
    ],
)
def test_bad_inputs(probs: list[float], labels: list[int] | list[str], message: str) -> None:
    for metric in (ece, brier, nll):
        with pytest.raises(ConfidenceDataError, match=message):
            metric(probs, labels)
    with pytest.raises(ValueError, match=message):  # also a ValueError
        ece(probs, labels)


def test_bad_bins() -> None:
    for bins in (0, -3, True):
        with pytest.raises(ConfigError, match="bins"):
            ece([0.5], [1], bins=bins)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=60),
    bins=st.integers(1, 20),
)
def test_ece_bounds_and_bin_counts(data: list[tuple[float, bool]], bins: int) -> None:
    probs = np.array([p for p, _ in data])
    labels = np.array([y for _, y in data])
    value = ece(probs, labels, bins)
    assert 0.0 <= value <= 1.0
    assert sum(b.count for b in reliability_bins(probs, labels, bins)) == len(data)
    # One bin: ECE is |base rate - mean forecast|.
    assert ece(probs, labels, 1) == pytest.approx(abs(labels.mean() - probs.mean()), abs=1e-12)
