"""Keys are told apart whatever their tenants, collections and retrievers contain."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sidecar.conformal import load_artifact
from sidecar.conformal.mondrian import CalibrationKey, key_label, split_label
from sidecar.conformal.monitor import ExchangeabilityMonitor
from sidecar.conformal.registry import CalibrationRegistry
from sidecar.conformal.signal import ConformalCertifier
from sidecar.contracts.events import RetrievalEvent

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "conformal" / "nq-open-minilm.json"
part = st.text(alphabet="ab/%2F5", min_size=1, max_size=6)


@given(a=st.tuples(part, part, part), b=st.tuples(part, part, part))
def test_two_keys_share_a_label_only_when_they_are_the_same_key(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    assert (key_label(*a) == key_label(*b)) is (a == b)
    assert split_label(key_label(*a)) == a


def test_names_without_a_slash_or_percent_keep_their_label() -> None:
    """The shipped calibration's key, its certificates and its dashboards are unchanged."""
    key = CalibrationKey("default", "nq-open", "qdrant-minilm-l6")
    assert key.label == "default/nq-open/qdrant-minilm-l6"
    assert CalibrationKey("org", "team/nq", "r").label == "org/team%2Fnq/r"


def _event(rid: str, tenant: str, collection: str, scores: list[float]) -> RetrievalEvent:
    return RetrievalEvent.model_validate(
        {
            "request_id": rid,
            "tenant": tenant,
            "collection": collection,
            "retriever": "qdrant-minilm-l6",
            "query": "q",
            "k": len(scores),
            "hits": [
                {"chunk_id": f"c{i}", "doc_id": "d", "score": s, "text": "x"}
                for i, s in enumerate(scores)
            ],
        }
    )


def test_one_tenants_rising_scores_leave_a_look_alike_tenants_certification_alone() -> None:
    """Audit: tenant ``org`` sending collection ``team/nq-open`` shared the key label of
    tenant ``org/team`` with ``nq-open``; 25 rising lists of the first switched off the
    certification of the second (``retrieval-scores-rising``, nothing trusted)."""
    registry = CalibrationRegistry(load_artifact(SHIPPED))
    certifier = ConformalCertifier(registry, ExchangeabilityMonitor(min_samples=1, window=50))
    for i in range(25):
        certifier.certify(_event(f"a{i}", "org", "team/nq-open", [0.30, 0.40, 0.55]))
    attacker = certifier.certify(_event("a25", "org", "team/nq-open", [0.30, 0.40, 0.55]))
    victim = certifier.certify(_event("v", "org/team", "nq-open", [0.62, 0.55, 0.40]))
    assert attacker.fallback_reason == "scores-rise-down-the-list"  # the check still works
    assert victim.fallback_reason != "scores-rise-down-the-list"
    assert victim.trusted_chunk_ids  # the shipped threshold trusts its top hit
