"""The composition root: runtime.build_processor wires certified allow to the coverage monitor."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from sidecar import runtime
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.policy.engine import PolicyEngine

REPO = Path(__file__).resolve().parents[2]


def test_the_served_policy_re_tests_its_allow_certificates_on_the_monitors_feedback() -> None:
    processor = runtime.build_processor(Settings.load())
    policy, coverage = processor.policy, processor.signals.coverage
    assert isinstance(policy, PolicyEngine) and isinstance(coverage, CoverageMonitor)
    assert policy.certificates is coverage.certificates
    # the shipped policy's certificate is registered with the monitor's tracker
    assert coverage.certificates.keys() == [c.certificate.key for c in policy.certified.values()]


def test_a_policy_or_model_anyone_can_write_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit: a world-writable policy (and models folder) loaded without a word."""
    policy = tmp_path / "policy.yaml"
    policy.write_text((REPO / "models" / "policy" / "default.yaml").read_text())
    policy.chmod(0o646)
    monkeypatch.setenv("GUARDRAIL_POLICY__FILE", str(policy))
    monkeypatch.setenv("GUARDRAIL_MODELS__DIR", str(REPO / "models"))
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        runtime.build_policy(Settings.load())
    [said] = [r.getMessage() for r in caplog.records if "can be changed by any user" in r.message]
    assert said.startswith("the policy can be changed by any user") and "-rw-r--rw-" in said
    policy.chmod(0o664)  # group-writable (a umask of 002): left alone
    assert runtime.warn_if_others_can_write(policy, "the policy") is False
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"x")
    (folder / "model.onnx").chmod(0o666)
    assert runtime.warn_if_others_can_write(folder, "the lookback classifier") is True


def test_a_served_model_anyone_can_write_is_warned_of_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The policy's check of the served versions resolves the models again: the warning came
    twice for each."""
    models = tmp_path / "models"
    shutil.copytree(REPO / "models", models)
    (models / "conformal" / "nq-open-minilm.json").chmod(0o646)
    monkeypatch.setenv("GUARDRAIL_MODELS__DIR", str(models))
    settings = Settings.load()
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        runtime.build_signals(settings)
        runtime.build_policy(settings)
    said = [r.getMessage() for r in caplog.records if "can be changed by any user" in r.message]
    assert len(said) == 1 and said[0].startswith("the conformal calibration")
