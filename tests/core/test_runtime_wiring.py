"""The composition root: runtime.build_processor wires certified allow to the coverage monitor."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from pathlib import Path

import pytest

from sidecar import runtime
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.events import RetrievalEvent, RetrievalSignal
from sidecar.kafka.permissions import Need
from sidecar.pipeline.ports import ClaimSession, SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.policy.engine import PolicyEngine
from sidecar.telemetry import Telemetry

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


def test_the_claim_checker_is_closed_when_the_sidecar_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An LLM judge's calls in flight are cut off at exit (``VerifierClaimChecker.close``):
    nothing called it, and the judge's pool threads (not daemons) held the process's exit
    for up to ``timeout_s`` after the final commit."""
    events: list[str] = []

    class Claims:
        version = "spy"

        def open(self, retrieval: RetrievalEvent, certification: RetrievalSignal) -> ClaimSession:
            raise AssertionError("no answer comes")

        def close(self) -> None:
            events.append("claims closed")

    class Service:
        """The Kafka service, left out: started, then SIGTERM; stopped."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            del args, kwargs

        async def start(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # serve()'s handler sets its stop event

        async def stop(self) -> None:
            events.append("service stopped")

    class Setup:
        def shutdown(self, timeout_s: float) -> None:
            del timeout_s

    async def counts(settings: Settings) -> dict[str, int]:
        return {settings.topics.retrieval: 1, settings.topics.generation: 1}

    async def allowed(settings: Settings, processor: object) -> list[Need]:
        del settings, processor
        return []

    monkeypatch.setenv("GUARDRAIL_HTTP__ENABLED", "false")
    monkeypatch.setenv("GUARDRAIL_GC_FREEZE", "false")
    monkeypatch.setattr(runtime, "verify_topics", counts)
    monkeypatch.setattr(runtime, "_check_permissions", allowed)  # no broker here
    monkeypatch.setattr(runtime, "SidecarService", Service)
    monkeypatch.setattr(runtime, "configure_from_env", lambda *args: Setup())
    monkeypatch.setattr(Telemetry, "from_setup", staticmethod(lambda *a, **k: None))
    processor = Processor(
        Settings.load(), PlaceholderPolicy(), signals=SignalSuite(claims=Claims())
    )
    asyncio.run(asyncio.wait_for(runtime.serve(Settings.load(), processor), 30))
    assert events == ["service stopped", "claims closed"]


class _ClosedClaims:
    """A claim checker that records its close (an LLM judge's calls in flight cut off)."""

    version = "spy"

    def __init__(self) -> None:
        self.closed = 0

    def open(self, retrieval: RetrievalEvent, certification: RetrievalSignal) -> ClaimSession:
        raise AssertionError("no answer comes")

    def close(self) -> None:
        self.closed += 1


def test_a_replay_closes_its_processors_claim_checker_even_when_it_fails() -> None:
    """``guardrail eval report`` / ``certify`` replay through a processor they build: its
    LLM judge was never closed, and a call in flight held their exit up to ``timeout_s``."""
    from sidecar.lab.report.evaluate import replay_rows

    claims = _ClosedClaims()
    processor = Processor(Settings.load(), PlaceholderPolicy(), signals=SignalSuite(claims=claims))
    assert replay_rows([], lambda: processor) == []
    assert claims.closed == 1
    with pytest.raises(KeyError):  # a row the replay cannot read: closed all the same
        replay_rows([{}], lambda: processor)
    assert claims.closed == 2


def test_a_suite_without_a_closable_claim_checker_closes_quietly() -> None:
    SignalSuite().close()
    claims = _ClosedClaims()
    suite = SignalSuite(claims=claims)
    suite.close()
    suite.close()
    assert claims.closed == 2  # closing twice is the checker's to allow (the judge's is)
