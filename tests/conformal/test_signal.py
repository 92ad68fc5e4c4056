"""The shipped calibration, served through the processor, fills the verdict's retrieval signal."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict, DeadLetterRecord, SignalStatus
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.runtime import build_signals
from tests.conftest import REPO, EventFactory, dumps


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
    settings = settings_factory(
        models={"dir": str(REPO / "models")}, signals={"lookback": False, "claims": False}
    )
    signals = build_signals(settings)
    assert signals.certifier is not None
    calibration = orjson.loads((REPO / "models/conformal/nq-open-minilm.json").read_text())
    raw_cut = calibration["n1"] + calibration["threshold"] * (calibration["n2"] - calibration["n1"])
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
    from sidecar.exceptions import ConfigError

    with pytest.raises(ConfigError, match="GUARDRAIL_SIGNALS__RETRIEVAL=false"):
        build_signals(settings_factory(models={"dir": "/nonexistent"}))
