"""``guardrail verdicts`` on the real broker, against verdict records on the topic.

Verdicts keyed by request id (the default partitioner, as the sidecar publishes them),
a tenant that holds ESC sequences, a bidi override and a forged line, a record whose
value is not UTF-8 under a request's key, one that is not JSON under a key of ESC
sequences, and a verdict put by hand on another partition than its key's. The command
reads them without a group, shows each as one escaped line (or its JSON document),
the unreadable ones with their place, and filters by request id (its murmur2
partition alone), tenant, decision, time and the newest N.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from guardrail_client.keys import partition_for
from sidecar.config import Settings
from sidecar.contracts.verdicts import AnswerVerdict, ClaimLabel, ClaimVerdict, Decision, Reason
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.kafka.harness import cli, settings_for

pytestmark = pytest.mark.connected

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "beta\x1b[2J\x1b]0;owned\x07\u202egnp.exe\nguardrail: 0 selected"
START = datetime.now(UTC) - timedelta(hours=1)


def verdict(rid: str, decision: Decision, tenant: str | None, *codes: str) -> AnswerVerdict:
    return AnswerVerdict(
        request_id=rid,
        idempotency_key=f"k-{rid}-{decision.value}",
        tenant=tenant,
        decision=decision,
        reasons=[Reason(code=c, message=f"{c}: \x1b[31m") for c in codes],
        policy="test",
        confidence=0.5 if "incomplete" not in codes else None,
        produced_at=datetime.now(UTC),
        sidecar_version="test",
    )


VERDICTS = [
    verdict("r-0", Decision.ALLOW, "acme", "profile.default"),
    verdict("r-1", Decision.CAVEAT, "acme", "profile.default", "claims.unsupported"),
    verdict("r-2", Decision.BLOCK, "beta", "profile.strict"),
    verdict("r-3", Decision.BLOCK, "acme", "incomplete"),
    verdict("r-4", Decision.ALLOW, HOSTILE, "profile.default"),
    verdict("r-5", Decision.ALLOW, "beta", "profile.default"),
]


async def test_verdicts_are_read_filtered_and_escaped(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    monkeypatch.setenv("GUARDRAIL_TOPICS__VERDICTS", t.verdicts)
    monkeypatch.setenv("GUARDRAIL_TOPICS__CLAIMS", t.claims)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    base_ms = int(START.timestamp() * 1000)
    try:
        for i, v in enumerate(VERDICTS):  # a minute apart: --limit keeps the newest
            await producer.send_and_wait(
                t.verdicts, v.model_dump_json().encode(), key=v.request_id.encode(),
                timestamp_ms=base_ms + i * 60_000,
            )  # fmt: skip
        await producer.send_and_wait(t.verdicts, b"\xff\xfe{not utf-8", key=b"r-2")
        await producer.send_and_wait(t.verdicts, b"{junk", key=b"\x1b[1A\x1b[2Kforged\nline")
        # r-2's verdict put by hand off its murmur2 partition: --request-id does not read it
        home = partition_for("r-2", t.partitions)
        stray = verdict("r-2", Decision.ALLOW, "beta", "profile.default")
        await producer.send_and_wait(
            t.verdicts, stray.model_dump_json().encode(), key=b"r-2",
            partition=(home + 1) % t.partitions,
        )  # fmt: skip
        claim = ClaimVerdict(
            request_id="r-1",
            idempotency_key="c",
            claim_index=0,
            span=(0, 5),
            text="Paris\x1b[2J",
            label=ClaimLabel.UNSUPPORTED,
            score=0.2,
            produced_at=datetime.now(UTC),
            verifier_version="test",
        )
        await producer.send_and_wait(t.claims, claim.model_dump_json().encode(), key=b"r-1")
    finally:
        await producer.stop()

    code, out, err = await cli(settings, "verdicts")
    lines = out.splitlines()
    assert code == 0, err
    assert len(lines) == 9  # 7 verdicts (the stray one too) and 2 unreadable records
    assert all(line.isprintable() for line in lines)  # no ESC, BEL, bidi or forged line
    assert "\x1b" not in out and "\u202e" not in out
    assert err.splitlines()[-1] == (
        f"{t.verdicts}: 9 selected (allow 4, caveat 1, block 1, incomplete 1, unreadable 2)"
    )
    [hostile] = [line for line in lines if "  r-4  " in line]
    assert "tenant=beta\\x1b[2J\\x1b]0;owned\\x07\\u202egnp.exe\\nguardrail: 0 selected" in hostile
    [caveat] = [line for line in lines if "  r-1  " in line]
    assert caveat.endswith(
        "  r-1  caveat  confidence=0.500  tenant=acme  reasons: profile.default, claims.unsupported"
    )
    unreadable = [line for line in lines if "  unreadable  " in line]
    assert len(unreadable) == 2
    assert any("key=r-2  at " in u and ": not UTF-8 (byte 0)" in u for u in unreadable)
    assert any("key=\\x1b[1A\\x1b[2Kforged\\nline  at " in u for u in unreadable)

    # one request: its partition alone (not the stray verdict), its unreadable record too
    code, out, err = await cli(settings, "verdicts", "--request-id", "r-2")
    assert code == 0, err
    assert len(out.splitlines()) == 2
    assert "  r-2  block  " in out and "not UTF-8" in out
    assert err.splitlines()[-1] == f"{t.verdicts}: 2 selected (block 1, unreadable 1)"

    code, out, err = await cli(settings, "verdicts", "--tenant", "beta", "--json")
    docs = [json.loads(line) for line in out.splitlines()]
    assert sorted(d["request_id"] for d in docs) == ["r-2", "r-2", "r-5"]
    assert all(d["tenant"] == "beta" for d in docs)
    assert "\x1b" not in out
    assert err.splitlines()[-1] == (
        f"{t.verdicts}: 3 selected (allow 2, block 1); 2 unreadable record(s) left out "
        "(--tenant, --decision: not readable)"
    )

    code, out, err = await cli(settings, "verdicts", "--decision", "incomplete", "--json")
    [doc] = [json.loads(line) for line in out.splitlines()]
    assert doc == json.loads(VERDICTS[3].model_dump_json())
    assert err.splitlines()[-1].startswith(f"{t.verdicts}: 1 selected (incomplete 1); 2 ")

    # the newest 2 of those selected (record time: the stray verdict's is now), oldest first
    code, out, err = await cli(settings, "verdicts", "--decision", "allow", "--limit", "2")
    assert [line.split()[1] for line in out.splitlines()] == ["r-5", "r-2"]
    assert err.splitlines()[-1].startswith(
        f"{t.verdicts}: 4 selected, the newest 2 shown (allow 4); 2 unreadable"
    )

    later = datetime.now(UTC).isoformat()  # after every record: none to read
    code, out, err = await cli(settings, "verdicts", "--since", later)
    assert (code, out) == (0, "")
    assert err.splitlines()[-1] == f"{t.verdicts}: 0 selected"

    code, out, err = await cli(settings, "verdicts", "--claims", "--request-id", "r-1")
    assert code == 0, err
    assert "  r-1  claim #0 unsupported  score=0.200  Paris\\x1b[2J" in out
    assert (
        err.splitlines()[-1]
        == f"{t.verdicts} + {t.claims}: 2 selected (caveat 1, claim unsupported 1)"
    )

    # the claim verdicts topic missing: exit 2, named, nothing printed
    monkeypatch.setenv("GUARDRAIL_TOPICS__CLAIMS", f"{t.claims}.nobody")
    code, out, err = await cli(settings, "verdicts", "--claims")
    assert (code, out) == (2, "")
    assert f"topic {t.claims}.nobody (GUARDRAIL_TOPICS__CLAIMS) does not exist" in err
    assert "guardrail topics create" in err


class Following:
    """``guardrail verdicts --follow ARGS`` in a process of its own, its stdout lines in a
    queue; ``stop()`` sends it Ctrl-C and returns its stderr (every line it printed is in
    the queue by then)."""

    def __init__(self, settings: Settings, *args: str) -> None:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GUARDRAIL_")},
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            "GUARDRAIL_TOPICS__VERDICTS": settings.topics.verdicts,
        }
        self.lines: queue.Queue[str] = queue.Queue()
        self._err: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "verdicts", "--follow", "--no-progress", *args],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._err.append)),
        ]
        for pump in self._pumps:
            pump.start()

    @staticmethod
    def _pump(stream: IO[str] | None, put: Callable[[str], None]) -> None:
        for line in stream or ():
            put(line)

    async def line(self, timeout_s: float = 60) -> str:
        return await asyncio.to_thread(self.lines.get, timeout=timeout_s)

    async def request_ids(self, n: int, timeout_s: float = 60) -> list[str]:
        """The request ids of the next ``n`` lines, or of those printed within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        ids: list[str] = []
        while len(ids) < n and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(queue.Empty):
                ids.append((await self.line(left)).split()[1])
        return ids

    async def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(self.proc.wait, timeout=60)
        for pump in self._pumps:
            await asyncio.to_thread(pump.join, timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return "".join(self._err)


async def send(settings: Settings, *verdicts: AnswerVerdict) -> None:
    """``verdicts`` keyed by request id, by a producer started now (it knows the topic's
    partitions as they are now)."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        for v in verdicts:
            await producer.send_and_wait(
                settings.topics.verdicts, v.model_dump_json().encode(), key=v.request_id.encode()
            )
    finally:
        await producer.stop()


async def test_follow_shows_new_verdicts_until_ctrl_c(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    await send(settings, verdict("r-old", Decision.ALLOW, "acme", "profile.default"))
    following = Following(settings)
    try:
        first = await following.line()
        assert "  r-old  allow  " in first
        await send(settings, verdict("r-new", Decision.CAVEAT, "acme", "profile.default"))
        second = await following.line()
        assert "  r-new  caveat  " in second
    finally:
        err = await following.stop()
    assert following.proc.returncode == 130, err[-3000:]
    assert err.splitlines()[-1] == f"{t.verdicts}: 2 selected (allow 1, caveat 1)"


def keyed_to(partition: int, count: int, prefix: str) -> str:
    """A request id that the default partitioner puts in ``partition`` of ``count``."""
    return next(
        f"{prefix}-{i}" for i in range(10_000) if partition_for(f"{prefix}-{i}", count) == partition
    )


async def test_follow_reads_partitions_added_while_it_follows(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """An operator grows the verdicts topic (``kafka-topics --alter --partitions``) while
    watching: the verdicts keyed to the new partitions are shown, from their first record,
    within :data:`~sidecar.kafka.scan.GROWTH_CHECK_S` (the consumer's metadata refresh, 5
    minutes, before: they were never shown meanwhile), and the old partitions go on where
    they were (nothing shown twice). ``--request-id`` follows its key to the partition it
    moves to."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    n = t.partitions
    moving = next(  # a request id whose partition changes when the topic grows
        f"r-moving-{i}"
        for i in range(10_000)
        if partition_for(f"r-moving-{i}", n) != partition_for(f"r-moving-{i}", n + 2)
    )
    await send(
        settings,
        verdict("r-old", Decision.ALLOW, "acme", "profile.default"),
        verdict(moving, Decision.ALLOW, "acme", "profile.default"),
    )
    every, one = Following(settings), Following(settings, "--request-id", moving)
    try:
        assert {(await every.line()).split()[1] for _ in range(2)} == {"r-old", moving}
        assert (await one.line()).split()[1:3] == [moving, "allow"]
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_partitions({t.verdicts: NewPartitions(total_count=n + 2)})
        finally:
            await admin.close()
        grown = time.monotonic()
        first_new, last_new = keyed_to(n, n + 2, "r-new"), keyed_to(n + 1, n + 2, "r-new")
        await send(
            settings,
            verdict(first_new, Decision.CAVEAT, "acme", "profile.default"),
            verdict(last_new, Decision.BLOCK, "acme", "profile.default"),
            verdict(keyed_to(0, n + 2, "r-on-0"), Decision.ALLOW, "acme", "profile.default"),
            verdict(moving, Decision.BLOCK, "acme", "profile.default"),  # its new partition
        )
        shown = sorted(await every.request_ids(4))
        assert shown == sorted([first_new, last_new, keyed_to(0, n + 2, "r-on-0"), moving])
        assert await one.request_ids(1) == [moving]
        took_s = time.monotonic() - grown
        assert took_s < 60, took_s  # not the consumer's 5-minute metadata refresh
    finally:
        err_every, err_one = await every.stop(), await one.stop()
    assert every.proc.returncode == 130, err_every[-3000:]
    assert every.lines.empty()  # nothing shown twice
    assert err_every.splitlines()[-1] == (f"{t.verdicts}: 6 selected (allow 3, caveat 1, block 2)")
    assert one.proc.returncode == 130, err_one[-3000:]
    assert err_one.splitlines()[-1] == f"{t.verdicts}: 2 selected (allow 1, block 1)"
