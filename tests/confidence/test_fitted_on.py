"""The calibrated confidence is served only beside the models it was fitted on (its card's
``inputs``): another lookback model, calibration or verifier refuses the start."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from sidecar import runtime
from sidecar.config import Settings
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.lab.confidence.recipe import _inputs_of

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "models/confidence/smollm2-135m-nq"


def test_the_shipped_confidence_names_the_shipped_models_it_was_fitted_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GUARDRAIL_SIGNALS__CLAIMS", "true")
    settings = Settings.load()
    card = json.loads((SHIPPED / "card.json").read_text())
    assert card["inputs"] == runtime.served_model_versions(settings)
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        runtime.build_policy(settings)
    assert "does not say which models" not in caplog.text


def test_another_lookback_model_refuses_the_start_and_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Audit: a retrained lookback model moved an answer's confidence from 0.51 to 0.095
    (under the enterprise profile's block at 0.1) and nothing was said."""
    monkeypatch.setenv("GUARDRAIL_SIGNALS__LOOKBACK_MODEL", "lookback/smollm2-135m-nq-fc")
    with pytest.raises(ConfigError) as info:
        runtime.build_processor(Settings.load())
    message = str(info.value)
    assert "lookback smollm2-135m-nq-cw@f6ffb3ba900a -> smollm2-135m-nq-fc@" in message
    assert "guardrail train confidence" in message
    assert "GUARDRAIL_SIGNALS__CONFIDENCE=false" in message
    monkeypatch.setenv("GUARDRAIL_SIGNALS__CONFIDENCE", "false")  # the way out it names
    runtime.build_processor(Settings.load())


def test_the_verifiers_band_is_a_served_option_not_another_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GUARDRAIL_SIGNALS__CLAIMS", "true")
    monkeypatch.setenv("GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION", "0.9")
    assert runtime.served_model_versions(Settings.load())["verifier"].endswith("+p0.9")
    runtime.build_policy(Settings.load())


def test_a_card_without_inputs_loads_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    older = tmp_path / "confidence"
    shutil.copytree(SHIPPED, older)
    card = json.loads((older / "card.json").read_text())
    del card["inputs"]
    (older / "card.json").write_text(json.dumps(card))
    monkeypatch.setenv("GUARDRAIL_SIGNALS__CONFIDENCE_MODEL", str(older))
    monkeypatch.setenv("GUARDRAIL_POLICY__FILE", str(tmp_path / "policy.yaml"))
    (tmp_path / "policy.yaml").write_text(
        "schema_version: 1\nname: p\nversion: '1'\ndefault_profile: general\n"
        "profiles:\n  general: {max_hallucination_rate: 0.3}\n"
    )
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        runtime.build_policy(Settings.load())
    assert "does not say which models it was fitted on" in caplog.text
    card["inputs"] = ["not", "a", "mapping"]
    (older / "card.json").write_text(json.dumps(card))
    with pytest.raises(ArtifactError, match="inputs must map a signal to its model version"):
        runtime.build_policy(Settings.load())


def test_a_refit_from_kafka_records_the_versions_its_verdicts_name() -> None:
    cal, lb = "qdrant@wiki:abc", "lookback@123"
    assert _inputs_of([(cal, lb), (cal, lb)]) == {"certifier": cal, "lookback": lb}
    # verdicts scored by two lookback models, or without certification: not one to name
    assert _inputs_of([(cal, lb), (cal, "lookback@456")]) == {"certifier": cal}
    assert _inputs_of([(None, lb)]) == {"lookback": lb}
