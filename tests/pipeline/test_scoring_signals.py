"""A request's Signals, built by scoring without validation: what validation builds."""

from __future__ import annotations

import pytest

from sidecar.contracts.events import (
    ClaimsSignal,
    LookbackSignal,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.pipeline.ports import NOT_CONFIGURED_CLAIMS, NOT_CONFIGURED_LOOKBACK
from sidecar.pipeline.scoring import UNAVAILABLE_CLAIMS, _signals

CERTIFIED = RetrievalSignal(
    status=SignalStatus.OK, trusted_chunk_ids=["c1"], m1=True, m2=0.5, q_hat=0.4, alpha=0.1
)
SCORED = LookbackSignal(status=SignalStatus.OK, p_factual=0.25, model_version="m@1")
CLAIMS = ClaimsSignal(status=SignalStatus.OK, n=2, supported=1, unsupported=1, reliability=0.5)


@pytest.mark.parametrize(
    ("retrieval", "lookback", "claims"),
    [
        (CERTIFIED, SCORED, CLAIMS),
        (RetrievalSignal(status=SignalStatus.NOT_CONFIGURED), NOT_CONFIGURED_LOOKBACK,
         NOT_CONFIGURED_CLAIMS),
        (RetrievalSignal(status=SignalStatus.UNAVAILABLE), SCORED, UNAVAILABLE_CLAIMS),
    ],
)  # fmt: skip
def test_signals_are_the_validated_model(
    retrieval: RetrievalSignal, lookback: LookbackSignal, claims: ClaimsSignal
) -> None:
    built = _signals(retrieval, lookback, claims)
    validated = Signals(retrieval=retrieval, lookback=lookback, claims=claims)
    assert built == validated
    assert built.model_fields_set == validated.model_fields_set
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.retrieval is validated.retrieval  # the instances kept, not copies
    assert built.lookback is validated.lookback and built.claims is validated.claims


def test_a_value_of_another_class_is_validated() -> None:
    """A dict (or a subclass) is not what the field's validation returns: validated."""
    with pytest.raises(ValueError, match="retrieval"):
        _signals({"status": "bogus"}, SCORED, CLAIMS)  # type: ignore[arg-type]
    built = _signals({"status": "ok"}, SCORED, CLAIMS)  # type: ignore[arg-type]
    assert type(built.retrieval) is RetrievalSignal
