"""The claim check's per-answer budget, as configured: verifier pairs, optionally time.

``GUARDRAIL_SIGNALS__CLAIM_PAIRS_PER_ANSWER`` reaches the served checker (the shipped
verifier, through ``runtime.build_signals``), and bad values stop the start with the
setting's name.
"""

from __future__ import annotations

import pytest

from sidecar import runtime
from sidecar.claims.checker import DEFAULT_ANSWER_PAIRS
from sidecar.config import Settings
from sidecar.contracts.events import RetrievalEvent, RetrievalSignal, SignalStatus
from sidecar.exceptions import ConfigError
from tests.claims.conftest import REPO

EVIDENCE = (
    "Mary Shelley wrote Frankenstein. It was first published in London in 1818. "
    "The novel tells the story of Victor Frankenstein, a young scientist."
)
ANSWER = (
    "Mary Shelley wrote Frankenstein. It was first published in 1818. "
    "Victor Frankenstein is a young scientist."
)


def _retrieval() -> RetrievalEvent:
    return RetrievalEvent.model_validate(
        {
            "request_id": "r-budget",
            "tenant": "t",
            "collection": "c",
            "query": "Who wrote Frankenstein?",
            "k": 1,
            "hits": [{"chunk_id": "c0", "doc_id": "d0", "score": 0.9, "text": EVIDENCE}],
        }
    )


def test_the_default_is_a_pair_budget_with_no_time_limit() -> None:
    sig = Settings.load().signals
    assert sig.claim_pairs_per_answer == DEFAULT_ANSWER_PAIRS
    assert sig.claim_seconds_per_answer is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CLAIM_PAIRS_PER_ANSWER", "0"),
        ("CLAIM_PAIRS_PER_ANSWER", "many"),
        ("CLAIM_SECONDS_PER_ANSWER", "0"),
        ("CLAIM_SECONDS_PER_ANSWER", "nan"),
        ("CLAIM_SECONDS_PER_ANSWER", "inf"),
    ],
)
def test_bad_budgets_stop_the_start_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(f"GUARDRAIL_SIGNALS__{name}", value)
    with pytest.raises(ConfigError, match=f"GUARDRAIL_SIGNALS__{name}"):
        Settings.load()


@pytest.mark.parametrize(("pairs", "verified"), [(1, 1), (2, 2), (64, 3)])
def test_the_configured_pair_budget_reaches_the_served_checker(pairs: int, verified: int) -> None:
    """The shipped verifier scores one window per claim for this short evidence."""
    settings = Settings.load(
        models={"dir": str(REPO / "models")},
        signals={"claims": True, "claim_pairs_per_answer": pairs},
    )
    checker = runtime.build_signals(settings).claims
    assert checker is not None
    certified = RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=["c0"], m1=True, m2=1.0)
    session = checker.open(_retrieval(), certified)
    results, signal = session.finish(ANSWER)
    assert len(results) == verified and signal.unchecked == 3 - verified
