"""A threshold finding (``lookback-low``, ``confidence-very-low``) reads as ``below`` writes it.

The finding is looked up by the value's two decimals (a new float on nearly every
answer missed ``below``'s cache); these hold it to the finding built from ``below``
itself, also where two decimals round up to the threshold or past it.
"""

from __future__ import annotations

from typing import Final

from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.policy.config import LookbackRules
from sidecar.policy.findings import Finding, SignalName, _thresholds, below, finding

SIGNAL: Final[SignalName] = "lookback"
NAME = "p(factual)"


def _reference(p: float, rules: LookbackRules) -> list[Finding]:
    """The findings as written before the two-decimal lookup."""
    if p < rules.block_below:
        return [
            finding(
                "block", f"{SIGNAL}-very-low", f"{NAME} = {below(p, rules.block_below)}", SIGNAL
            )
        ]
    if p < rules.caveat_below:
        return [
            finding("caveat", f"{SIGNAL}-low", f"{NAME} = {below(p, rules.caveat_below)}", SIGNAL)
        ]
    return []


THRESHOLD = st.floats(0.0, 1.0).map(lambda t: round(t, 3)) | st.floats(0.0, 1.0)


@given(st.floats(-1e3, 1e3, allow_nan=False) | st.floats(-0.01, 1.01), THRESHOLD, THRESHOLD)
@example(0.0996, 0.1, 0.5)  # two decimals read 0.10: not below 0.1, more places are written
@example(0.09999999, 0.05, 0.1)  # 0.10, 0.100, ... 0.100000: the repr is written
@example(0.2999, 0.1, 0.3)
@example(0.29, 0.1, 0.3)
@example(-5.0, 0.0, 0.0)
@example(1e-12, 0.0, 1e-12)
@example(0.0, 0.0, 0.5)
@example(1e300, 0.2, 0.5)
@example(0.05, 0.0, 0.123456789)  # the threshold as configured, to 6 significant digits
@example(0.01, 0.0333333333, 0.7777777777)
def test_a_threshold_finding_is_the_one_below_writes(
    p: float, block_below: float, caveat_below: float
) -> None:
    rules = LookbackRules(block_below=min(block_below, caveat_below), caveat_below=caveat_below)
    assert _thresholds(p, rules, SIGNAL, NAME) == _reference(p, rules)
    assert _thresholds(p, rules, SIGNAL, NAME) == _reference(p, rules)  # cached, the same


def test_the_messages_read_as_configured() -> None:
    rules = LookbackRules(block_below=0.1, caveat_below=0.5)
    assert [f.reason.message for f in _thresholds(0.0996, rules, SIGNAL, NAME)] == [
        "p(factual) = 0.0996 < 0.1"
    ]
    assert [
        (f.action, f.reason.code, f.reason.message) for f in _thresholds(0.25, rules, SIGNAL, NAME)
    ] == [("caveat", "lookback-low", "p(factual) = 0.25 < 0.5")]
