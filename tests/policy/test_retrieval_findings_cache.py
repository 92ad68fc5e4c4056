"""The cached retrieval findings (``retrieval-low-trusted-fraction``, ``-calibration-fallback``)
read as the f-strings they replaced wrote them, also where a cache hit meets a key that is
equal as a number but written differently (``0.0`` and ``-0.0``)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.contracts.events import RetrievalSignal, SignalStatus
from sidecar.policy.config import Action, Profile, RetrievalRules
from sidecar.policy.findings import Finding, _retrieval, finding


def _signal(m2: float, reason: str | None) -> RetrievalSignal:
    return RetrievalSignal(
        status=SignalStatus.OK,
        trusted_chunk_ids=["c1"],
        m1=True,
        m2=m2,
        alpha=0.1,
        certifiable=True,
        fallback=reason is not None,
        fallback_reason=reason,
    )


def _reference(sig: RetrievalSignal, rules: RetrievalRules) -> list[Finding]:
    """The findings as written before the caches (monitor and certifiable cases aside)."""
    out = []
    if sig.m2 is not None and sig.m2 < rules.min_trusted_fraction:
        out.append(
            finding(
                rules.when_low_trusted_fraction,
                "retrieval-low-trusted-fraction",
                f"m2 = {sig.m2:.2f} of the retrieved chunks are trusted, "
                f"below {rules.min_trusted_fraction:.2f}",
                "retrieval",
            )
        )
    if sig.fallback:
        out.append(
            finding(
                "allow",
                "retrieval-calibration-fallback",
                "no calibration for this key; the global calibration was used"
                + (f" ({sig.fallback_reason})" if sig.fallback_reason else ""),
                "retrieval",
            )
        )
    return out


@given(
    st.floats(0.0, 1.0) | st.sampled_from([0.0, -0.0, 0.25, 0.5]),
    st.floats(0.0, 1.0) | st.sampled_from([0.0, 0.3, 0.5]),
    st.sampled_from(["caveat", "block", "allow"]),
    st.none() | st.sampled_from(["", "no calibration for acme", "x"]),
)
@example(0.0, 0.5, "caveat", None)
@example(-0.0, 0.5, "caveat", None)  # after 0.0: a cache keyed by the number says 0.00
@example(0.25, 0.5, "block", "why")
@example(0.25, 0.5, "caveat", "why")  # the same numbers, another action
def test_cached_retrieval_findings_read_as_written(
    m2: float, fraction: float, action: Action, reason: str | None
) -> None:
    rules = RetrievalRules(min_trusted_fraction=fraction, when_low_trusted_fraction=action)
    profile = Profile(max_hallucination_rate=0.2, retrieval=rules)
    sig = _signal(m2, reason)
    assert _retrieval(sig, profile) == _reference(sig, rules)
    assert _retrieval(sig, profile) == _reference(sig, rules)  # a cache hit: the same
