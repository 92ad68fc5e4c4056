"""Reason messages read true: a value shown below a threshold is below it as printed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.policy.findings import below, finding


@pytest.mark.parametrize(
    ("p", "threshold", "text"),
    [
        (0.12, 0.3, "0.12 < 0.3"),
        (0.0999, 0.1, "0.0999 < 0.1"),  # two decimals would print 0.10 < 0.1
        (0.2999999, 0.3, "0.2999999 < 0.3"),
        (0.0, 0.05, "0.00 < 0.05"),
    ],
)
def test_the_shown_value_is_below_the_threshold(p: float, threshold: float, text: str) -> None:
    assert below(p, threshold) == text


@given(
    threshold=st.floats(min_value=1e-6, max_value=1.0),
    gap=st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
)
def test_any_value_below_reads_below(threshold: float, gap: float) -> None:
    p = threshold - gap * threshold
    if not p < threshold:
        return
    shown, limit = below(p, threshold).split(" < ")
    assert float(shown) < threshold
    assert limit == f"{threshold:g}"


def test_a_repeated_finding_is_the_cached_one() -> None:
    """Findings are frozen and their texts repeat: a second identical one skips the
    ``Reason`` validation (the cache once slid onto ``below`` when it was added above)."""
    first = finding("caveat", "lookback-low", f"p = {below(0.2, 0.3)}", "lookback")
    again = finding("caveat", "lookback-low", f"p = {below(0.2, 0.3)}", "lookback")
    assert again is first
    assert finding("block", "lookback-low", first.reason.message, "lookback") is not first
