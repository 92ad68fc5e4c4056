"""The certifier's signal, computed without ``certify``'s Certification, is the one built from it.

``ConformalCertifier.certify`` reads eq. 4's trusted set from ``trusted_set`` and
the rest from the resolved calibration instead of building a ``Certification``
(15 frozen fields) per retrieval. Two certifiers over the shipped calibration, one
as it was (``_reference``: the signal built from ``certify``'s Certification), fed
the same drawn retrievals and decisions, give the same signals (fields, types,
order) or the same dead-letter reason and detail.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import Settings
from sidecar.conformal.certify import certify
from sidecar.conformal.monitor import ExchangeabilityMonitor, monitor_key
from sidecar.conformal.registry import CalibrationRegistry
from sidecar.conformal.signal import ConformalCertifier, retrieval_signal
from sidecar.contracts.events import (
    RetrievalEvent,
    RetrievalHit,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.contracts.verdicts import SCORES_RISING
from sidecar.exceptions import InputError
from sidecar.runtime import build_signals
from tests.conftest import REPO


def _reference(certifier: ConformalCertifier, event: RetrievalEvent) -> RetrievalSignal:
    """The certifier's signal as it was built, from ``certify``'s Certification."""
    resolved = certifier.registry.resolve(event.tenant, event.collection, event.retriever)
    scores = [h.score for h in event.hits]
    cert = certify(scores, resolved, depth=event.k)
    rising = certifier.order.observe(resolved.requested_label, scores)
    if rising or not cert.certifiable:
        trusted: list[str] = []
        m1, m2, state, mean = False, 0.0, None, None
    else:
        trusted = [event.hits[i].chunk_id for i in cert.trusted_indices]
        m1, m2 = cert.m1, cert.m2
        key = monitor_key(cert.calibration_key, fallback=cert.fallback, tenant=event.tenant)
        state, mean = certifier.monitor.reading(key, cert.alpha, cert.calibration_id)
    return retrieval_signal(
        {
            "status": SignalStatus.OK,
            "trusted_chunk_ids": trusted,
            "m1": m1,
            "m2": m2,
            "q_hat": cert.q_hat,
            "alpha": cert.alpha,
            "certifiable": cert.certifiable,
            "calibration_version": cert.calibration_id,
            "calibration_key": cert.calibration_key,
            "fallback": rising or cert.fallback,
            "fallback_reason": SCORES_RISING if rising else cert.fallback_reason,
            "clipped_scores": cert.n_clipped,
            "monitor": None if state is None else state.value,
            "m1_mean": mean,
        }
    )


@functools.cache
def _registry() -> CalibrationRegistry:
    signals = build_signals(
        Settings.load(
            models={"dir": str(REPO / "models")}, signals={"lookback": False, "claims": False}
        )
    )
    assert isinstance(signals.certifier, ConformalCertifier)
    return signals.certifier.registry


def _certifier() -> ConformalCertifier:
    # a fresh monitor with a short window, so drawn decisions move its state
    return ConformalCertifier(_registry(), ExchangeabilityMonitor(window=20, min_samples=5))


def _outcome(certify_one: Any, event: RetrievalEvent) -> tuple[str, Any]:
    try:
        signal = certify_one(event)
    except InputError as exc:
        return "dead-letter", (exc.reason, exc.detail)
    return "signal", [(k, type(v), v) for k, v in signal.__dict__.items()]


_valid = st.floats(min_value=0.3, max_value=0.9)
_score = st.one_of(  # mostly scores the calibration reads, sometimes ones it refuses
    _valid,
    _valid,
    _valid,
    st.sampled_from([0.0, 0.62, 1.0, 5.0, -3.0, math.nan, math.inf, 1e308]),
    st.integers(min_value=-1, max_value=1),
)
OWN_KEY = ("default", "nq-open", "qdrant-minilm-l6")  # the shipped key; the others fall back


_keys = st.one_of(
    st.just(OWN_KEY),
    st.tuples(
        st.sampled_from(["default", "acme"]),
        st.sampled_from(["nq-open", "wiki"]),
        st.sampled_from(["qdrant-minilm-l6", "other"]),
    ),
)


@st.composite
def _retrievals(draw: st.DrawFn) -> list[RetrievalEvent]:
    """Retrievals of the shipped key and of others (fallbacks), scores falling, rising
    (distances), tied, out of range or not numbers (built without validation: the
    certifier checks its scores itself)."""
    events = []
    # one key for most of an example's retrievals, and a retriever of distances in half
    # the examples: 20 lists of one key must rise before the certifier calls it rising
    key = draw(_keys)
    distances = draw(st.booleans())
    for n in range(draw(st.integers(min_value=1, max_value=60))):
        scores = draw(st.lists(_score, min_size=1, max_size=5))
        if distances or draw(st.booleans()):  # rising, NaN left out
            scores = sorted(s for s in scores if not math.isnan(s))
        tenant, collection, retriever = key if draw(st.integers(0, 9)) else draw(_keys)
        hits = [
            RetrievalHit.model_construct(chunk_id=f"c{i}", doc_id="d", score=s, text="t")
            for i, s in enumerate(scores)
        ]
        events.append(
            RetrievalEvent.model_construct(
                request_id=f"r-{n}",
                tenant=tenant,
                collection=collection,
                retriever=retriever,
                query="q",
                k=len(hits) + draw(st.integers(min_value=-1, max_value=2)),
                hits=hits,
            )
        )
    return events


@settings(max_examples=200, deadline=None, derandomize=True)
@given(events=_retrievals(), decided=st.lists(st.booleans(), min_size=60, max_size=60))
def test_the_signal_is_the_one_built_from_certify(
    events: list[RetrievalEvent], decided: list[bool]
) -> None:
    new, old = _certifier(), _certifier()
    for event, decide in zip(events, decided, strict=False):
        got = _outcome(new.certify, event)
        assert got == _outcome(lambda e: _reference(old, e), event)
        if got[0] == "signal" and decide:  # a decided request feeds both monitors alike
            signal = RetrievalSignal(**{k: v for k, _, v in got[1]})
            new.observe_decided(event, signal)
            old.observe_decided(event, signal)


def test_a_retriever_of_distances_gets_the_same_signals() -> None:
    """Rising scores on the shipped key: once the certifier calls them distances (20 lists),
    nothing is certified and the fallback says why, on both paths."""
    new, old = _certifier(), _certifier()
    tenant, collection, retriever = OWN_KEY
    outcomes = []
    for n in range(30):
        hits = [
            RetrievalHit(chunk_id=f"c{i}", doc_id="d", score=0.4 + 0.05 * i + 0.001 * n, text="t")
            for i in range(3)
        ]
        event = RetrievalEvent(
            request_id=f"r-{n}",
            tenant=tenant,
            collection=collection,
            retriever=retriever,
            query="q",
            k=3,
            hits=hits,
        )
        got = _outcome(new.certify, event)
        assert got == _outcome(lambda e: _reference(old, e), event)
        outcomes.append(dict((k, v) for k, _, v in got[1]))
    assert outcomes[0]["fallback"] is False
    assert outcomes[-1]["fallback_reason"] == SCORES_RISING and outcomes[-1]["fallback"] is True
