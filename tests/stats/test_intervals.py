"""Wilson score interval against published values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.exceptions import ConfigError
from sidecar.stats.intervals import normal_quantile, wilson_interval


@pytest.mark.parametrize(
    ("x", "n", "low", "high"),
    [
        # Newcombe (1998), Statistics in Medicine 17:857-872, Table I, method 3 (Wilson score)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_newcombe_1998_examples(x: int, n: int, low: float, high: float) -> None:
    ci = wilson_interval(x, n, 0.95)
    assert ci.low == pytest.approx(low, abs=5e-5)
    assert ci.high == pytest.approx(high, abs=5e-5)
    assert ci.estimate == x / n


def test_normal_quantiles() -> None:
    assert normal_quantile(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert normal_quantile(0.99) == pytest.approx(2.575829, abs=1e-6)


def test_edges() -> None:
    assert (wilson_interval(0, 0).low, wilson_interval(0, 0).high) == (0.0, 1.0)
    full = wilson_interval(20, 20)
    assert full.high == 1.0
    assert full.low == pytest.approx(1 - 0.1611, abs=5e-5)  # mirror of 0/20


@pytest.mark.parametrize(
    ("x", "n", "conf"), [(-1, 5, 0.95), (6, 5, 0.95), (1, 5, 1.0), (1, 5, 0.0), (True, 5, 0.9)]
)
def test_bad_arguments(x: int, n: int, conf: float) -> None:
    with pytest.raises(ConfigError):
        wilson_interval(x, n, conf)


@given(n=st.integers(1, 10_000), data=st.data(), conf=st.sampled_from([0.8, 0.95, 0.999]))
def test_contains_the_estimate_and_is_symmetric(n: int, data: st.DataObject, conf: float) -> None:
    x = data.draw(st.integers(0, n))
    ci = wilson_interval(x, n, conf)
    assert 0.0 <= ci.low <= x / n <= ci.high <= 1.0
    mirror = wilson_interval(n - x, n, conf)
    assert mirror.low == pytest.approx(1 - ci.high, abs=1e-12)
    assert wilson_interval(x, n, 0.5).high - wilson_interval(x, n, 0.5).low <= ci.high - ci.low


def test_a_bool_is_refused_even_after_its_int_was_cached() -> None:
    """The cache keys by type: ``True`` never reads as the cached interval of 1."""
    assert wilson_interval(1, 2, 0.9) is wilson_interval(1, 2, 0.9)  # cached
    with pytest.raises(ConfigError, match="bool"):
        wilson_interval(True, 2, 0.9)
    with pytest.raises(ConfigError, match="bool"):
        wilson_interval(1, True, 0.9)
