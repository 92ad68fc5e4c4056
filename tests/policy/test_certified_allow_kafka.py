"""Certified allow through the Kafka loop: allows, feedback, a broken certificate, the report.

Written once and run twice (FastStream's in-memory broker and the real broker),
with the loop of ``tests/kafka/test_feedback_reports.py`` built around a
processor whose policy names an allow certificate.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

import tests.kafka.test_feedback_reports as loops
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.events import AnswerVerdict, CoverageReport, Decision
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy.config import parse_policy
from sidecar.policy.engine import PolicyEngine
from tests.conftest import EventFactory, dumps
from tests.fakes import ThresholdCertifier
from tests.kafka.harness import settings_for
from tests.policy.test_certified_allow import POLICY, Stub, certificate

KEY = "acme/wiki/qdrant-minilm-l6"


@pytest.fixture(params=["memory", pytest.param("connected", marks=pytest.mark.connected)])
async def loop(
    request: pytest.FixtureRequest,
    unique_topics: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[loops.Loop]:
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "nq.json").write_text(
        certificate(key=KEY, model="stub").model_dump_json(), encoding="utf-8"
    )
    config = parse_policy(POLICY.replace("BELOW", "caveat").replace("nq-open:", "wiki:"))

    def certified_processor(settings: Settings) -> tuple[Processor, CoverageMonitor]:
        policy = PolicyEngine(config, base_dir=tmp_path, models={"confidence": "stub"})
        monitor = CoverageMonitor(report_interval_s=loops.REPORT_INTERVAL_S)
        suite = SignalSuite(
            certifier=ThresholdCertifier(calibration_key=KEY), coverage=monitor, confidence=Stub()
        )
        policy.attach_certificates(monitor.certificates)  # as runtime.build_processor does
        return Processor(settings, policy, signals=suite), monitor

    monkeypatch.setattr(loops, "coverage_processor", certified_processor)
    topics = loops.topics_with_feedback(unique_topics)
    if request.param == "memory":
        async with loops.memory_loop(settings_for(topics)) as h:
            yield h
    else:
        broker: LocalKafka = request.getfixturevalue("kafka_broker")
        async with loops.real_loop(settings_for(topics, broker.bootstrap_servers)) as h:
            yield h


async def test_feedback_breaks_the_certificate_and_withdraws_the_allow(
    loop: loops.Loop, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    t = loop.settings.topics

    async def decide(rids: list[str], seen: int) -> list[AnswerVerdict]:
        for rid in rids:
            await loop.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
            await loop.publish(t.generation, dumps(final_event(rid)), rid.encode())
        msgs = await loop.collect(t.verdicts, seen + len(rids))
        return [AnswerVerdict.model_validate(orjson.loads(m.value)) for m in msgs[seen:]]

    first = await decide([f"req-{i}" for i in range(12)], 0)
    assert {v.decision for v in first} == {Decision.ALLOW}
    assert {(v.certified_risk, v.certified_delta, v.certificate) for v in first} == {
        (0.2, 0.1, KEY)
    }
    for i in range(12):  # 10 of 12 certified allows were wrong: far above 0.2
        await loop.publish(t.feedback, loops.feedback(f"req-{i}", i < 2), f"req-{i}".encode())
    deadline = time.monotonic() + 30.0
    broken: CoverageReport | None = None
    while broken is None and time.monotonic() < deadline:
        await loop.poll()
        reports = [CoverageReport.model_validate_json(m.value) for m in loop.received[t.reports]]
        broken = next(
            (r for r in reports if r.certificate is not None and r.certificate.labelled == 12),
            None,
        )
    assert broken is not None, f"no coverage.report re-testing the certificate on {t.reports}"
    assert broken.calibration_key == KEY
    assert broken.certificate is not None
    assert (broken.certificate.errors, broken.certificate.status) == (10, "violated")
    [after] = await decide(["req-after"], 12)
    assert after.decision is Decision.CAVEAT
    assert "certificate-violated" in {r.code for r in after.reasons}
    assert after.certified_risk is None
    assert loop.received[t.dlq] == []
