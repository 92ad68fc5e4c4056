"""Hostile answers and reviewers against a real sidecar process with claims on.

* an adversarial answer (``"x" + ", and y" * 8000 + "."``, 56 KB) is decided
  while ``/livez`` keeps answering: segmentation is linear and the processor
  runs off the event loop;
* a false answer dressed as a pleasantry ("Certainly, …") is still verified;
* a flood of labels for one request counts as one label in the coverage report.
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.lab.replay import Record, send
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import read_settled, settings_for
from tests.kafka.test_hostile import env, wait_for_verdicts  # noqa: F401 - env: a fixture

pytestmark = pytest.mark.connected

ADVERSARIAL = "x" + ", and y" * 8000 + "."


@pytest.fixture
def claims_env(env: dict[str, str]) -> Iterator[dict[str, str]]:  # noqa: F811
    yield {
        **env,
        "GUARDRAIL_SIGNALS__CLAIMS": "true",
        "GUARDRAIL_COVERAGE__REPORT_INTERVAL_S": "1",
        "GUARDRAIL_JOIN__TTL_MS": "60000",
    }


def livez(port: int) -> float | None:
    """Seconds /livez took to answer 200, or None when it did not within 2 s."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2) as r:
            return time.monotonic() - started if r.status == 200 else None
    except OSError:
        return None


async def test_adversarial_answers_neither_stall_the_sidecar_nor_skip_verification(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    claims_env: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    proc = SidecarProcess(claims_env, tmp_path / "sidecar.log")
    proc.start()
    records = []
    for rid, answer in (
        ("req-long", ADVERSARIAL),
        ("req-polite", "Certainly, the Eiffel Tower is in Berlin."),
        ("req-after", "Frankenstein was written by Mary Shelley."),
    ):
        records.append(Record(t.retrieval, rid.encode(), dumps(retrieval_event(rid))))
        records.append(Record(t.generation, rid.encode(), dumps(final_event(rid, answer=answer))))
    probes: list[float | None] = []
    try:
        await send(settings, records)
        deadline = time.monotonic() + 90
        done = False
        while time.monotonic() < deadline and not done:
            probes.append(await asyncio.to_thread(livez, proc.port))
            got = {
                r.key.decode()
                for r in await read_settled(kafka_broker.bootstrap_servers, t.verdicts, 0.2)
            }
            done = {"req-long", "req-polite", "req-after"} <= got
        verdicts = [
            orjson.loads(r.value)
            for r in await read_settled(kafka_broker.bootstrap_servers, t.verdicts)
        ]
        claims = [
            orjson.loads(r.value)
            for r in await read_settled(kafka_broker.bootstrap_servers, t.claims)
        ]
    finally:
        proc.signal(signal.SIGTERM)
    assert done, "not every answer was decided within 90 s"
    assert len(probes) >= 3
    assert all(p is not None and p < 1.0 for p in probes), probes  # the loop never stalled
    polite = [c for c in claims if c["request_id"] == "req-polite"]
    assert any("Eiffel Tower" in c["text"] for c in polite), polite
    [decision] = [v["decision"] for v in verdicts if v["request_id"] == "req-polite"]
    assert decision != "allow"


async def test_a_flood_of_labels_for_one_request_counts_once_in_the_coverage_report(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    claims_env: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    no_claims = {**claims_env, "GUARDRAIL_SIGNALS__CLAIMS": "false"}
    proc = SidecarProcess(no_claims, tmp_path / "sidecar.log")
    proc.start()
    ids = [f"req-{i}" for i in range(5)]
    requests = [
        Record(topic, rid.encode(), dumps(event))
        for rid in ids
        for topic, event in ((t.retrieval, retrieval_event(rid)), (t.generation, final_event(rid)))
    ]

    def label(rid: str, correct: bool) -> Record:
        event = {"schema_version": 1, "event_type": "feedback", "request_id": rid}
        return Record(t.feedback, rid.encode(), dumps({**event, "correct": correct, "source": "r"}))

    try:
        await send(settings, requests)
        await wait_for_verdicts(kafka_broker.bootstrap_servers, t.verdicts, set(ids), 60)
        await send(settings, [label(rid, True) for rid in ids])
        await send(settings, [label("req-0", False) for _ in range(500)])  # one hostile reviewer
        await asyncio.sleep(4.0)  # a few report intervals
        reports = [
            orjson.loads(r.value)
            for r in await read_settled(kafka_broker.bootstrap_servers, t.reports, 0.5)
        ]
    finally:
        proc.signal(signal.SIGTERM)
    latest: dict[str, Any] = reports[-1]
    measured = latest["measured_hallucination"]
    assert measured["trials"] == len(ids)  # one label per request, not 505
    assert measured["successes"] == 1  # the last label for req-0 wins
