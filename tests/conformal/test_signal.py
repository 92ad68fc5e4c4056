"""The shipped calibration, served through the processor, fills the verdict's retrieval signal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sidecar.config import Settings
from sidecar.conformal.monitor import ExchangeabilityMonitor, MonitorState
from sidecar.conformal.signal import ConformalCertifier
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    DeadLetterRecord,
    RetrievalEvent,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.exceptions import ConfigError
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.runtime import build_signals
from tests.conftest import REPO, EventFactory, dumps


def _shipped_settings(settings_factory: Callable[..., Settings]) -> Settings:
    """The shipped models, certification alone (lookback and claims off)."""
    found: Settings = settings_factory(
        models={"dir": str(REPO / "models")}, signals={"lookback": False, "claims": False}
    )
    return found


def _calibration() -> dict[str, Any]:
    found: dict[str, Any] = orjson.loads(
        (REPO / "models/conformal/nq-open-minilm.json").read_text()
    )
    return found


def _raw_cut() -> float:
    """The raw score at which the shipped calibration starts to trust a hit."""
    c = _calibration()
    return float(c["n1"] + c["threshold"] * (c["n2"] - c["n1"]))


def verdict_for(processor: Processor, retrieval: bytes, final: bytes) -> AnswerVerdict:
    processor.on_message(InputKind.RETRIEVAL, retrieval, None, InputRef("r", 0, 0), 0.0)
    step = processor.on_message(InputKind.GENERATION, final, None, InputRef("g", 0, 0), 0.0)
    [out] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    return AnswerVerdict.model_validate(orjson.loads(out.value))


def test_verdict_carries_certification_from_the_shipped_calibration(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = _shipped_settings(settings_factory)
    signals = build_signals(settings)
    assert signals.certifier is not None
    calibration = _calibration()
    raw_cut = _raw_cut()
    hits = [
        {"chunk_id": "high", "doc_id": "d1", "score": raw_cut + 0.05, "text": "a"},
        {"chunk_id": "low", "doc_id": "d2", "score": raw_cut - 0.05, "text": "b"},
    ]
    event = retrieval_event(
        collection="nq-open", tenant="default", retriever="qdrant-minilm-l6", hits=hits, k=10
    )
    v = verdict_for(
        Processor(settings, PlaceholderPolicy(), signals=signals),
        dumps(event),
        dumps(final_event()),
    )
    r = v.signals.retrieval
    assert r.status is SignalStatus.OK
    assert r.trusted_chunk_ids == ["high"]
    assert r.m1 is True and r.m2 == pytest.approx(1 / 10)
    assert r.q_hat == pytest.approx(calibration["q_hat"])
    assert r.calibration_version == calibration["calibration_id"]
    assert r.fallback is False and r.monitor == "warming-up"
    assert v.model_versions["certifier"] == calibration["calibration_id"]


def test_unknown_collection_is_dead_lettered_when_configured(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    settings = settings_factory(
        models={"dir": str(REPO / "models")},
        signals={"lookback": False, "claims": False, "unknown_collection": "reject"},
    )
    processor = Processor(settings, PlaceholderPolicy(), signals=build_signals(settings))
    step = processor.on_message(
        InputKind.RETRIEVAL,
        dumps(retrieval_event(collection="elsewhere")),
        None,
        InputRef("r", 0, 0),
        0.0,
    )
    [out] = step.outputs
    assert DeadLetterRecord.from_headers(out.headers).reason == "unknown-collection"
    assert len(processor.store) == 0


def test_missing_calibration_fails_fast_with_the_way_out(
    settings_factory: Callable[..., Settings],
) -> None:
    with pytest.raises(ConfigError, match="GUARDRAIL_SIGNALS__RETRIEVAL=false"):
        build_signals(settings_factory(models={"dir": "/nonexistent"}))


def _calibrated_hits(score_offset: float) -> list[dict[str, object]]:
    """One hit ``score_offset`` above (or below) the shipped calibration's raw-score cut."""
    return [{"chunk_id": "c", "doc_id": "d", "score": _raw_cut() + score_offset, "text": "a"}]


def _nq_event(
    retrieval_event: EventFactory, rid: str, tenant: str, offset: float
) -> dict[str, Any]:
    return retrieval_event(
        rid,
        collection="nq-open",
        tenant=tenant,
        retriever="qdrant-minilm-l6",
        hits=_calibrated_hits(offset),
        k=10,
    )


def test_the_monitor_counts_decided_requests_only_once_each(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    # Fed when a retrieval arrived, the monitor counted retrievals whose answer never came
    # (and ones read again after a rebalance); it counts what was decided.
    settings = _shipped_settings(settings_factory)
    signals = build_signals(settings)
    assert isinstance(signals.certifier, ConformalCertifier)
    monitor = signals.certifier.monitor
    processor = Processor(settings, PlaceholderPolicy(), signals=signals)
    key = "default/nq-open/qdrant-minilm-l6"
    for i in range(5):  # half requests: the answer never comes
        event = _nq_event(retrieval_event, f"half-{i}", "default", -0.05)
        processor.on_message(InputKind.RETRIEVAL, dumps(event), None, InputRef("r", 0, i), 0.0)
    assert monitor.status(key) is None
    event = _nq_event(retrieval_event, "whole", "default", 0.05)
    v = verdict_for(processor, dumps(event), dumps(final_event("whole")))
    assert v.signals.retrieval.monitor == "warming-up"
    status = monitor.status(key)
    assert status is not None and status.n == 1 and status.m1_mean == 1.0


def test_one_tenant_cannot_trip_another_tenants_alarm_on_the_global_calibration(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    # Tenants without their own calibration share the global one; one window for all let
    # a tenant's 36 low-score retrievals caveat every other tenant's answers (the audit).
    settings = _shipped_settings(settings_factory)
    certifier = build_signals(settings).certifier
    assert isinstance(certifier, ConformalCertifier)

    def decided(tenant: str, i: int, offset: float) -> RetrievalSignal:
        event = RetrievalEvent.model_validate(
            _nq_event(retrieval_event, f"{tenant}-{i}", tenant, offset)
        )
        signal = certifier.certify(event)
        certifier.observe_decided(event, signal)
        return signal

    for i in range(60):
        assert decided("acme", i, 0.05).fallback
    for i in range(200):
        decided("evil", i, -0.05)
    readings = certifier.monitor_readings()
    assert readings["global[evil]"].broken
    assert not readings["global[acme]"].broken
    assert decided("acme", 60, 0.05).monitor == "ok"
    assert decided("evil", 200, 0.05).monitor == "exchangeability-broken"


def test_monitor_windows_are_bounded_and_a_new_calibration_reads_warming_up() -> None:
    monitor = ExchangeabilityMonitor(window=10, min_samples=1, max_keys=3)
    for key in ("a", "b", "c", "d"):
        monitor.observe_m1(key, True, 0.1, calibration_id="cal-1")
    assert sorted(monitor.statuses()) == ["b", "c", "d"]
    assert monitor.reading("d", 0.1, "cal-1") == (MonitorState.OK, 1.0)
    assert monitor.reading("d", 0.1, "cal-2") == (MonitorState.WARMING_UP, None)
    assert monitor.reading("a", 0.1, "cal-1") == (MonitorState.WARMING_UP, None)
    with pytest.raises(ConfigError, match="max_keys"):
        ExchangeabilityMonitor(max_keys=0)
