"""A verdict written from its values is the verdict the model writes, byte for byte."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.contracts.answer_json import answer_verdict_json
from sidecar.contracts.codec import encode
from sidecar.contracts.events import (
    AnswerVerdict,
    ChunkForecast,
    ClaimsSignal,
    Decision,
    LookbackSignal,
    Reason,
    RetrievalSignal,
    RetrieveAgain,
    Signals,
    SignalStatus,
)

_text = st.text(max_size=30)
_finite = st.floats(allow_nan=False, allow_infinity=False)
_probability = st.floats(min_value=0.0, max_value=1.0)
_opt = st.none
_status = st.sampled_from(SignalStatus)

_retrieval = st.builds(
    RetrievalSignal,
    status=_status,
    trusted_chunk_ids=st.lists(_text, max_size=3),
    m1=_opt() | st.booleans(),
    m2=_opt() | _probability,
    q_hat=_opt() | _finite,
    alpha=_opt() | _probability,
    certifiable=_opt() | st.booleans(),
    calibration_version=_opt() | _text,
    calibration_key=_opt() | _text,
    fallback=st.booleans(),
    fallback_reason=_opt() | _text,
    clipped_scores=st.integers(0, 10),
    monitor=_opt() | st.sampled_from(["warming-up", "ok", "exchangeability-broken"]),
    m1_mean=_opt() | _probability,
)
_lookback = st.builds(
    LookbackSignal, status=_status, p_factual=_opt() | _probability, model_version=_opt() | _text
)
_claims = st.builds(
    ClaimsSignal,
    status=_status,
    n=st.integers(0, 9),
    reliability=_opt() | _probability,
    reliability_level=_opt() | st.sampled_from(["HIGH", "MEDIUM", "LOW"]),
    evidence_scope=_opt() | st.sampled_from(["trusted", "all-retrieved"]),
    superseded_claims=st.lists(st.integers(0, 9), max_size=3),
)
_reason = st.builds(
    Reason,
    code=st.from_regex(r"[a-z0-9][a-z0-9.\-]{0,20}", fullmatch=True),
    message=_text,
    signal=st.sampled_from(["retrieval", "lookback", "claims", "confidence", "policy"]),
)
_forecast = st.builds(
    ChunkForecast, chunk_id=_text, p_useful=_probability, retrieval_rank=st.integers(0, 9)
)
_advice = st.builds(
    RetrieveAgain,
    best_forecast=_probability,
    tau=_probability,
    hint=_text,
    missing_terms=st.lists(_text, max_size=3),
)
_when = st.datetimes(
    timezones=st.just(UTC) | st.builds(timezone, st.timedeltas(timedelta(hours=-12), timedelta(0)))
)


@st.composite
def verdict_values(draw: st.DrawFn) -> dict[str, Any]:
    values: dict[str, Any] = {
        "request_id": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,20}", fullmatch=True)),
        "idempotency_key": draw(_text),
        "tenant": draw(_opt() | _text),
        "decision": draw(st.sampled_from(Decision)),
        "reasons": draw(st.lists(_reason, max_size=4)),
        "policy": draw(_text),
        "signals": Signals(
            retrieval=draw(_retrieval), lookback=draw(_lookback), claims=draw(_claims)
        ),
        "produced_at": draw(_when),
        "sidecar_version": draw(_text),
    }
    optional = {
        "stage": st.sampled_from(["stream", "final"]),
        "escalate": st.booleans(),
        "confidence": _opt() | _probability,
        "confidence_features": st.dictionaries(_text, _opt() | _finite, max_size=4),
        "chunk_forecast": st.lists(_forecast, max_size=3),
        "advice": _opt() | _advice,
        "certified_risk": _opt() | _probability,
        "certified_delta": _opt() | _probability,
        "certificate": _opt() | _text,
        "caveat_text": _opt() | _text,
        "rewritten_answer": _opt() | _text,
        "model_versions": st.dictionaries(_text, _text, max_size=3),
        "timings_ms": st.dictionaries(_text, _finite, max_size=3),
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            values[name] = draw(strategy)
    return values


@settings(max_examples=300, deadline=None, derandomize=True)
@given(values=verdict_values())
def test_the_bytes_are_the_models_bytes(values: dict[str, Any]) -> None:
    written = answer_verdict_json(**values)
    assert written == encode(AnswerVerdict(**values))
    AnswerVerdict.model_validate_json(written)  # and what it wrote reads back


def _minimal(decision: Decision, **extra: Any) -> bytes:
    return answer_verdict_json(
        request_id="r-1",
        idempotency_key="k",
        tenant=None,
        decision=decision,
        reasons=[],
        policy="p/1",
        signals=Signals(),
        produced_at=datetime(2026, 1, 1, tzinfo=UTC),
        sidecar_version="0",
        **extra,
    )


def test_the_fields_are_the_models_fields() -> None:
    """A field added to AnswerVerdict must be written here too (or the bytes lose it)."""
    minimal = _minimal(Decision.ALLOW)
    model = AnswerVerdict(
        request_id="r-1",
        idempotency_key="k",
        decision=Decision.ALLOW,
        reasons=[],
        policy="p/1",
        produced_at=datetime(2026, 1, 1, tzinfo=UTC),
        sidecar_version="0",
    )
    assert minimal == encode(model)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("timings_ms", {"signals": math.inf}),
        ("confidence_features", {"m2": math.nan}),
        ("confidence", 1.5),
        ("confidence", math.nan),
    ],
)
def test_values_the_model_would_refuse_are_refused(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=name):
        _minimal(Decision.BLOCK, **{name: value})


class _Lookalike:
    """Not a contract model, though it has a ``__dict__`` of what looks like fields."""

    def __init__(self) -> None:
        self.code = "checks-passed"
        self.message = "every signal passed"
        self.signal = "policy"


@pytest.mark.parametrize(
    "extra",
    [
        {"reasons": [_Lookalike()]},
        {"chunk_forecast": [_Lookalike()]},
        {"advice": _Lookalike()},
        {"reasons": [object()]},
    ],
)
def test_only_contract_models_are_written_nested(extra: dict[str, Any]) -> None:
    """Nested values are written from a pydantic model's fields only: anything else is
    refused (as the model would refuse it), never written from its ``__dict__``."""
    values: dict[str, Any] = {"decision": Decision.ALLOW, "reasons": [], **extra}
    with pytest.raises(TypeError, match="not JSON serializable"):
        answer_verdict_json(
            request_id="r-1",
            idempotency_key="k",
            tenant=None,
            policy="p/1",
            signals=Signals(),
            produced_at=datetime(2026, 1, 1, tzinfo=UTC),
            sidecar_version="0",
            **values,
        )
