"""Hostile headers on the real broker: one bad record costs nothing more than itself.

* A header whose name is not UTF-8 (a Go or C producer can send one): aiokafka's
  reader raised out of every fetch, nothing was read from any partition again, and
  the consumer task was restarted hundreds of times a second while ``/readyz`` said
  ready. The name is now read as Java's consumer reads it (U+FFFD for a bad byte).
* A record the consumer can never read (a kind not handled yet): ``/livez`` says so.

The helpers (and the small topic limits) are ``test_hostile_records``'s, and so is the
test of null header values (FastStream's parser died on ``None``: in batch mode the
whole poll was never tracked and was committed past, 20 requests lost).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.consumer import fetcher
from aiokafka.record import memory_records

from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import real_harness, settings_for, wait_until
from tests.kafka.test_hostile_records import all_committed, answered, produce, requests

pytestmark = pytest.mark.connected

REPO = Path(__file__).resolve().parents[2]


def publish_with_a_bad_header_name(settings: Settings, body: Path) -> None:
    """``req-bad``'s final event, its header name not UTF-8 (tests/kafka/bad_header_name.py)."""
    subprocess.run(
        [sys.executable, "-m", "tests.kafka.bad_header_name", settings.kafka.bootstrap_servers,
         settings.topics.generation, "req-bad", str(body)],
        check=True, cwd=REPO, env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"}, timeout=60,
    )  # fmt: skip


async def test_a_header_name_that_is_not_utf8_costs_nothing(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    tmp_path: Path,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    before = requests(settings, [f"req-a{i:02d}" for i in range(5)], retrieval_event, final_event)
    await produce(
        settings, [*before, (t.retrieval, b"req-bad", dumps(retrieval_event("req-bad")), [])]
    )
    body = tmp_path / "final.json"
    body.write_bytes(dumps(final_event("req-bad")))
    publish_with_a_bad_header_name(settings, body)
    after = requests(settings, [f"req-b{i:02d}" for i in range(5)], retrieval_event, final_event)
    await produce(settings, after)
    async with real_harness(settings) as h:
        verdicts = answered(await h.collect(t.verdicts, 11))
        assert len(verdicts) == 11  # req-bad among them, decided on its merits
        assert "incomplete" not in {r.code for r in verdicts["req-bad"].reasons}
        await all_committed(h, settings, len(before) + 2 + len(after))
        more = requests(settings, [f"req-c{i:02d}" for i in range(3)], retrieval_event, final_event)
        await produce(settings, more)  # and the consumer goes on reading
        assert len(answered(await h.collect(t.verdicts, 14))) == 14
        await wait_until(lambda: h.service.ready, 10, "ready")


async def test_a_record_the_consumer_can_never_read_makes_the_sidecar_not_live(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    final_event: EventFactory,
    tmp_path: Path,
) -> None:
    """A poison record of a kind not handled yet (stood in for by aiokafka's strict reader,
    put back after start) used to spin the consume task unseen; now /livez says so."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    body = tmp_path / "final.json"
    body.write_bytes(dumps(final_event("req-bad")))
    async with real_harness(settings) as h:
        lenient = fetcher.MemoryRecords
        fetcher.MemoryRecords = memory_records.MemoryRecords  # the strict reader
        try:
            publish_with_a_bad_header_name(settings, body)
            await wait_until(lambda: not h.service.state.live, 30, "liveness to drop")
        finally:
            fetcher.MemoryRecords = lenient
        assert "UnicodeDecodeError" in str(h.service.state.consumer_failing)
        await asyncio.sleep(1.5)  # three ticks: the watch drops the dead tasks as they come
        held = len(getattr(h.service.subscriber, "tasks", []))
        assert held < h.service.state.consumer_failures  # they do not pile up in memory


async def test_a_record_with_too_many_headers_costs_itself_not_memory(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """200,000 empty headers (a 400 KB record) on ``req-bomb``'s final event: its value
    goes to the DLQ (``too-many-headers``) without them, every other request is answered
    and the offsets are committed past it (1M headers took the process from 102 to 319 MB
    RSS, 2.5M to 951 MB: over the dev chart's 768 MiB)."""
    limit = 1 << 20
    settings = settings_for(
        unique_topics, kafka_broker.bootstrap_servers, topics={"max_message_bytes": limit}
    )
    await create_topics(settings)
    t = settings.topics
    before = requests(settings, [f"req-a{i:02d}" for i in range(5)], retrieval_event, final_event)
    after = requests(settings, [f"req-b{i:02d}" for i in range(5)], retrieval_event, final_event)
    bomb_value = dumps(final_event("req-bomb"))
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, acks="all", max_request_size=2 * limit
    )
    await producer.start()
    try:
        for topic, key, value, headers in [
            *before,
            (t.retrieval, b"req-bomb", dumps(retrieval_event("req-bomb")), []),
            (t.generation, b"req-bomb", bomb_value, [("", b"")] * 200_000),
            *after,
        ]:
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()
    async with real_harness(settings) as h:
        verdicts = answered(await h.collect(t.verdicts, 11))
        assert len(verdicts) == 11
        assert "incomplete" in {r.code for r in verdicts["req-bomb"].reasons}
        assert sum("incomplete" in {r.code for r in v.reasons} for v in verdicts.values()) == 1
        [dead] = await h.collect(t.dlq, 1)
        assert dead.headers["x-dlq-reason"] == b"too-many-headers"
        assert dead.value == bomb_value
        assert len(dead.headers) < 20
        await all_committed(h, settings, len(before) + 2 + len(after))
