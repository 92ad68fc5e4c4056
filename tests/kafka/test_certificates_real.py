"""The fleet's certificate withdrawals on the real broker (``rag.certificates``).

Replica A finds its certificate broken and publishes the withdrawal on its tick;
a replica started afterwards (B, or A restarted: both start with empty windows)
withdraws the allow before it reads a single input, and a tombstone
(``guardrail certificates reinstate KEY``) gives both the allow back. Junk on the
topic (not JSON, another key inside) is ignored: it can withdraw nothing.
"""

from __future__ import annotations

import asyncio
import io
import logging
from contextlib import redirect_stderr, redirect_stdout

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.cli.main import main
from sidecar.confidence.certificate_check import CertificateTracker
from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.topics import create_topics, verify_topics
from sidecar.kafka.withdrawals import CertificateBoard
from sidecar.lab.localkafka.broker import LocalKafka
from tests.kafka.harness import real_harness, settings_for, wait_until

pytestmark = pytest.mark.connected

KEY = "acme/wiki/qdrant-minilm-l6"


def replica() -> CertificateTracker:
    tracker = CertificateTracker(window=100)
    tracker.register(KEY, 0.2, 0.1, "f1")
    tracker.register("acme/other/bm25", 0.2, 0.1, "f2")
    return tracker


async def send(settings: Settings, key: bytes | None, value: bytes | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(settings.topics.certificates, value, key=key)
    finally:
        await producer.stop()


async def cli(settings: Settings, *argv: str) -> tuple[int, str]:
    """``guardrail ARGV`` as a user runs it (its own event loop: a thread here)."""

    def run() -> tuple[int, str]:
        out = io.StringIO()
        with redirect_stdout(out):
            code = main([*argv, "--bootstrap-servers", settings.kafka.bootstrap_servers])
        return code, out.getvalue()

    return await asyncio.to_thread(run)


async def test_a_withdrawal_reaches_every_replica_started_later_until_reinstated(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)  # ticks: 100 ms
    await create_topics(settings)
    monkeypatch.setenv("GUARDRAIL_TOPICS__CERTIFICATES", settings.topics.certificates)
    a = replica()
    async with real_harness(settings, certificates=a) as h:
        for i in range(50):  # A's labels: half of its certified allows wrong vs risk 0.2
            a.observe_label(KEY, f"r{i}", wrong=i % 2 == 0)
        board = h.service.certificates
        assert board is not None
        await wait_until(lambda: board.applied == 1, 20, "A's withdrawal read back")
        assert a.withdrawn(KEY) is not None
        # junk and foreign records: ignored, never a withdrawal
        await send(settings, b"acme/other/bm25", b"{not json")
        await send(settings, b"acme/other/bm25", orjson.dumps({"event_type": "x"}))
        [withdrawal] = [r for r in (await _latest(settings)) if r.get("calibration_key") == KEY]
        foreign = {**withdrawal, "calibration_key": KEY}
        del foreign["status"]
        await send(settings, b"acme/other/bm25", orjson.dumps(foreign))
        await wait_until(lambda: board.ignored == 3, 20, "the junk read")
        assert not a.violated("acme/other/bm25")

    # B (or A restarted): withdrawn as soon as it is started, before any input or label
    b = replica()
    b_board = CertificateBoard(settings, b)
    await b_board.start()
    try:
        assert b.violated(KEY) and not b.violated("acme/other/bm25")
        assert b.check(KEY).labelled == 0
        assert b.take_withdrawals() == []  # the fleet knows: B announces nothing
        code, out = await cli(settings, "certificates", "list")
        assert code == 0
        rows = {r["calibration_key"]: r for r in map(orjson.loads, out.splitlines())}
        assert rows[KEY]["status"] == "withdrawn" and rows[KEY]["errors"] == 25
        assert (await cli(settings, "certificates", "reinstate", "acme/nothing/here")) == (2, "")
        assert await cli(settings, "certificates", "reinstate", KEY) == (0, f"{KEY}: reinstated\n")
        await wait_until(lambda: not b.violated(KEY), 20, "B to see the tombstone")
    finally:
        await b_board.stop()
    c = replica()  # and one started after the tombstone
    c_board = CertificateBoard(settings, c)
    await c_board.start()
    await c_board.stop()
    assert not c.violated(KEY)


async def test_a_withdrawal_found_just_before_a_stop_is_published_by_the_stop(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A found the certificate broken but stopped before its tick published it (a rolling
    restart): its window dies with it, so the stop publishes what the topic lacks."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    monkeypatch.setenv("GUARDRAIL_TOPICS__CERTIFICATES", settings.topics.certificates)
    join = settings.join.model_copy(update={"sweep_interval_ms": 600_000})  # no tick
    a = replica()
    async with real_harness(settings.model_copy(update={"join": join}), certificates=a) as h:
        for i in range(50):
            a.observe_label(KEY, f"r{i}", wrong=i % 2 == 0)
        assert a.violated(KEY)
        assert h.service.certificates is not None and h.service.certificates.applied == 0
    b = replica()
    b_board = CertificateBoard(settings, b)
    await b_board.start()
    await b_board.stop()
    assert b.violated(KEY) and not b.violated("acme/other/bm25")
    assert b.check(KEY).labelled == 0


async def test_junk_under_a_withdrawn_key_is_answered_with_the_withdrawal_again(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Junk is ignored, but on the compacted topic it would be all that is left of the
    key (a replica started after compaction would allow): a replica holding the
    withdrawal publishes it again."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    monkeypatch.setenv("GUARDRAIL_TOPICS__CERTIFICATES", settings.topics.certificates)
    a = CertificateTracker(window=100, reannounce_s=0.5)
    a.register(KEY, 0.2, 0.1, "f1")
    async with real_harness(settings, certificates=a) as h:
        for i in range(50):
            a.observe_label(KEY, f"r{i}", wrong=i % 2 == 0)
        board = h.service.certificates
        assert board is not None
        await wait_until(lambda: board.applied == 1, 20, "A's withdrawal read back")
        await send(settings, KEY.encode(), b"{not json")
        await wait_until(lambda: board.applied == 2, 20, "the withdrawal published again")
        assert board.ignored == 1 and a.violated(KEY)
    latest = [r for r in await _latest(settings) if r.get("calibration_key") == KEY]
    assert [r["status"] for r in latest] == ["withdrawn"]


async def test_a_certificates_topic_with_more_than_one_partition_stops_the_start(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(settings.topics.certificates, 3, 1)])
    finally:
        await admin.close()
    board = CertificateBoard(settings, replica())
    with pytest.raises(ConfigError, match="has 3 partitions; it must have exactly 1"):
        await board.start()


async def test_a_certificates_topic_that_is_not_compacted_is_named_at_start(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:  # made by hand, with the broker's default policy
        await admin.create_topics(
            [
                NewTopic(
                    settings.topics.certificates, 1, 1, topic_configs={"cleanup.policy": "delete"}
                )
            ]
        )
    finally:
        await admin.close()
    await create_topics(settings)
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        await verify_topics(settings)
    [line] = [r.getMessage() for r in caplog.records if "cleanup.policy" in r.getMessage()]
    assert f"{settings.topics.certificates} (GUARDRAIL_TOPICS__CERTIFICATES)" in line
    assert "cleanup.policy=delete" in line and "Set cleanup.policy=compact" in line


async def _latest(settings: Settings) -> list[dict[str, object]]:
    code, out = await cli(settings, "certificates", "list")
    assert code == 0
    return [orjson.loads(line) for line in out.splitlines()]


async def test_list_on_an_empty_topic_says_so_on_stderr(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `certificates list` printed nothing at all: no way to tell an empty topic
    from a command that did not run."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    monkeypatch.setenv("GUARDRAIL_TOPICS__CERTIFICATES", settings.topics.certificates)
    err = io.StringIO()
    with redirect_stderr(err):
        code, out = await cli(settings, "certificates", "list")
    assert (code, out) == (0, "")  # stdout stays JSON lines (none) for a script
    assert err.getvalue() == (
        f"{settings.topics.certificates}: no certificate withdrawals (no allow certificate "
        "was withdrawn or reinstated)\n"
    )
