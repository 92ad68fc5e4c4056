"""What the fleet decided survives a restart (real broker, ``guardrail run`` processes).

A fleet whose retriever stopped ranking correct chunks into the top K has its alarm on
(reason ``exchangeability-broken`` on every verdict). A replica killed and replaced while
traffic flows used to start with empty windows: its first 50 decisions of the key read
``warming-up``, without the caveat. It now reads the verdicts topic's tail back before it
consumes (``sidecar.kafka.warmstart``), so every verdict after the restart still carries
the alarm. Labels sent afterwards for the requests decided before reach them, on the
replacement and on a survivor that took the killed replica's partitions over (before,
they were unmatched). Junk on the verdicts topic is skipped; a cluster that cannot be
read leaves both empty and the start goes on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from guardrail_client.keys import partition_for
from sidecar.config import Settings
from sidecar.contracts.events import Decision, RetrievalSignal, SignalStatus
from sidecar.kafka.topics import create_topics
from sidecar.kafka.warmstart import read_decided, read_labels, warm_start
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from sidecar.lab.replay import Record, send
from sidecar.pipeline.ports import ReadLabel
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.runtime import build_signals
from tests.conformal.test_monitor_warm_start import KEY
from tests.conformal.test_signal import _calibrated_hits
from tests.kafka.harness import wait_until
from tests.kafka.test_scale_out import _env, _settings, fleet, watch  # noqa: F401 - fixture

pytestmark = pytest.mark.connected


def requests(settings: Settings, prefix: str, n: int, *, trusted: bool) -> list[Record]:
    """``n`` whole requests under the shipped calibration's key, every hit below (or above)
    the score its calibration trusts."""
    t = settings.topics
    out = []
    for i in range(n):
        rid = f"{prefix}-{i}"
        retrieval = {
            "schema_version": 1,
            "event_type": "retrieval",
            "request_id": rid,
            "tenant": "default",
            "collection": "nq-open",
            "retriever": "qdrant-minilm-l6",
            "query": "who wrote frankenstein",
            "k": 10,
            "hits": _calibrated_hits(0.05 if trusted else -0.05),
        }
        final = {
            "schema_version": 1,
            "event_type": "generation.final",
            "request_id": rid,
            "answer": "Mary Shelley.",
            "generator_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        }
        out.append(Record(t.retrieval, rid.encode(), orjson.dumps(retrieval)))
        out.append(Record(t.generation, rid.encode(), orjson.dumps(final)))
    return out


def labels(settings: Settings, ids: list[str]) -> list[Record]:
    """A wrong-answer label for each request, keyed (so on its request's partition)."""
    return [
        Record(
            settings.topics.feedback,
            rid.encode(),
            orjson.dumps(
                {
                    "schema_version": 1,
                    "event_type": "feedback",
                    "request_id": rid,
                    "correct": False,
                    "source": "reviewer",
                }
            ),
        )
        for rid in ids
    ]


def with_metrics(env: dict[str, str], log: Path) -> SidecarProcess:
    """A replica with its own Prometheus port (``labelled`` scrapes it)."""
    port = free_port()
    env = {
        **env,
        "GUARDRAIL_METRICS__PROMETHEUS_HOST": "127.0.0.1",
        "GUARDRAIL_METRICS__PROMETHEUS_PORT": str(port),
    }
    return SidecarProcess(env, log)


def scraped(replica: SidecarProcess, wanted: Callable[[Sample], bool]) -> float:
    """The sum of the replica's ``wanted`` samples (its scrape), -1 when it does not
    answer."""
    url = f"http://127.0.0.1:{replica.env['GUARDRAIL_METRICS__PROMETHEUS_PORT']}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return -1.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if wanted(sample)
    )


def window(replica: SidecarProcess, count: str) -> float:
    """One of the replica's coverage window counts of the key (its scrape), -1 when it
    does not answer."""
    return scraped(
        replica,
        lambda sample: (
            sample.name == f"guardrail_coverage_window_{count}"
            and sample.labels.get("calibration_key") == KEY
        ),
    )


def labelled(replica: SidecarProcess) -> float:
    """The labels of uncovered requests in the replica's coverage window (its scrape)."""
    return window(replica, "labelled_uncovered")


def fleet_window(replicas: list[SidecarProcess]) -> tuple[float, float]:
    """The replicas' window requests and covered requests of the key, summed (as the
    fleet's bound sums them)."""
    return (
        sum(window(r, "requests") for r in replicas),
        sum(window(r, "covered") for r in replicas),
    )


PARTITIONS = 3


def home(request_id: str) -> int:
    """The partition a request's inputs, verdict and labels are on (keyed by its id)."""
    return partition_for(request_id, PARTITIONS)


class Monitor:
    """Each request's final verdict's monitor reading, and when it came (a ``VerdictSink``)."""

    def __init__(self) -> None:
        self.reading: dict[str, str | None] = {}
        self.at: dict[str, float] = {}
        self.said: dict[str, tuple[str, list[dict[str, Any]]]] = {}  # decision, reasons

    def add(self, verdict: dict[str, Any], now: float) -> None:
        if verdict.get("stage") == "final":
            rid = verdict["request_id"]
            self.reading[rid] = verdict["signals"]["retrieval"]["monitor"]
            self.said[rid] = (verdict["decision"], verdict["reasons"])
            self.at.setdefault(rid, now)


@asynccontextmanager
async def two_replicas(
    broker: LocalKafka,
    topics: dict[str, str],
    tmp_path: Path,
    replicas: list[SidecarProcess],
    partitions: int = PARTITIONS,
    count: int = 2,
) -> AsyncIterator[tuple[Settings, dict[str, str], Monitor]]:
    """Two ``guardrail run`` replicas (or ``count``; each with its metrics) over 3
    partitions (or ``partitions``), ready, put in ``replicas`` (the test's ``fleet``: killed
    at its end); yields the settings, the replicas' environment and the final verdicts'
    monitor readings as they come."""
    settings = _settings(broker.bootstrap_servers, topics, partitions)
    await create_topics(settings)
    env = {**_env(settings), "GUARDRAIL_SIGNALS__LOOKBACK": "false"}
    replicas += [with_metrics(env, tmp_path / f"replica-{i}.log") for i in range(count)]
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in replicas))
    await wait_until(lambda: all(p.ready() for p in replicas), 30, "the replicas ready")
    seen = Monitor()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, stop))
    try:
        yield settings, env, seen
    finally:
        stop.set()
        await watcher


async def test_a_replica_killed_and_replaced_mid_traffic_keeps_the_fleets_alarm(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],  # noqa: F811
) -> None:
    async with two_replicas(kafka_broker, unique_topics, tmp_path, fleet) as (
        settings,
        env,
        seen,
    ):
        # the retriever goes bad: no hit is trusted, and both replicas' alarms come on
        broken = requests(settings, "bad", 300, trusted=False)
        # paced: a replica reads each retrieval by the alarm as its last consumed batch left
        # it, so 96 requests of a partition in one batch (sent while the first assignment
        # read back) all read warming-up
        await send(settings, broken, rate_per_s=150)
        await wait_until(lambda: len(seen.reading) == 300, 45, "300 verdicts")
        for partition in range(PARTITIONS):  # each replica judged 50 before its alarm came on
            last = [m for rid, m in seen.reading.items() if home(rid) == partition]
            said = Counter(
                (seen.said[rid][0], *sorted(r["code"] for r in seen.said[rid][1]))
                for rid in seen.reading
                if home(rid) == partition
            )
            assert last[-10:] == ["exchangeability-broken"] * 10, (partition, Counter(last), said)

        # one replica is killed and replaced while traffic flows; then more traffic
        during = requests(settings, "during", 60, trusted=True)
        sender = asyncio.create_task(send(settings, during, rate_per_s=len(during) / 6.0))
        await asyncio.sleep(1.0)
        assert await asyncio.to_thread(fleet[0].signal, signal.SIGKILL) == -signal.SIGKILL
        replacement = with_metrics(env, tmp_path / "b.log")
        fleet.append(replacement)
        await asyncio.to_thread(replacement.start)
        assert await sender == len(during)
        ids = [f"during-{i}" for i in range(60)]
        await wait_until(lambda: set(ids) <= set(seen.reading), 60, "60 more verdicts")
        await send(settings, requests(settings, "after", 60, trusted=True))
        ids += [f"after-{i}" for i in range(60)]
        await wait_until(lambda: set(ids) <= set(seen.reading), 60, "60 more verdicts")
    # labels now for the requests decided before the kill (a label comes after its answer)
    await send(settings, labels(settings, [f"bad-{i}" for i in range(300)]))
    readings = {rid: seen.reading[rid] for rid in ids}
    assert set(readings.values()) == {"exchangeability-broken"}, readings
    log = replacement.tail(100_000)
    assert "warm start: the last" in log and f"alarm on: {KEY}" in log, log
    # its assignments read on from where its warm start stopped (the pod test checks the
    # first one exactly: it did not run before)
    assert any("now read here" in ln and "past what this process" in ln for ln in log.splitlines())
    # the replacement's partitions (its last assignment): the "after" requests there are its
    assigned = [ln for ln in log.splitlines() if "assigned to partitions" in ln][-1]
    mine = {int(p) for p in re.findall(r"retrieval', partition=(\d+)", assigned)}
    decided_there = [rid for rid in ids if rid.startswith("after") and home(rid) in mine]
    assert decided_there, assigned  # the replacement decided some, every one with the alarm
    # every label reached its request: on the replacement's partitions, requests decided
    # before it started (the warm start); on the partitions the survivor took over from the
    # killed replica, requests that one decided (read back when they were assigned)
    theirs = sum(home(f"bad-{i}") in mine for i in range(300))
    assert 0 < theirs < 300
    survivor = fleet[1]
    await wait_until(
        lambda: labelled(survivor) + labelled(replacement) == 300, 30, "300 labels counted"
    )
    assert labelled(replacement) == theirs
    # the coverage windows moved with the partitions: the replicas' counts sum to every
    # request decided, once (before, the killed replica's went with it and the replacement
    # counted only what it decided itself)
    await wait_until(
        lambda: fleet_window([survivor, replacement]) == (420.0, 120.0),
        30,
        "the fleet's windows to hold the 420 requests, 120 of them covered",
    )
    assert window(replacement, "requests") > theirs  # refilled, not only its own
    recalled = [ln for ln in survivor.tail(100_000).splitlines() if "now read here" in ln]
    print(  # pytest -s: what the report quotes
        f"\n{len(decided_there)} of the 60 later requests decided by the replacement "
        f"(partitions {sorted(mine)}), all 120 exchangeability-broken; {theirs} labels on its "
        f"partitions for requests decided before it started, and {300 - theirs} on the "
        f"survivor's, all counted; survivor: {[ln.split(' INFO ', 1)[1] for ln in recalled]}; "
        f"{[ln.split(' INFO ', 1)[1] for ln in log.splitlines() if 'warm start:' in ln]}"
    )


async def test_partitions_a_killed_replica_leaves_bring_their_requests_labels_along(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],  # noqa: F811
) -> None:
    """No replacement: the survivor takes the killed replica's partitions over, and the
    labels for requests the killed one decided there (after the survivor had started)
    come to it. It reads those requests back when it is given the partitions."""
    async with two_replicas(kafka_broker, unique_topics, tmp_path, fleet) as (settings, _, seen):
        await send(settings, requests(settings, "q", 200, trusted=False))
        await wait_until(lambda: len(seen.reading) == 200, 45, "200 verdicts")
    killed, survivor = fleet
    assert await asyncio.to_thread(killed.signal, signal.SIGKILL) == -signal.SIGKILL

    def holds_all() -> bool:
        lines = [ln for ln in survivor.tail(100_000).splitlines() if "assigned to" in ln]
        return len(re.findall(r"retrieval', partition=", lines[-1] if lines else "")) == 3

    await wait_until(holds_all, 45, "the survivor to hold every partition")
    await send(settings, labels(settings, [f"q-{i}" for i in range(200)]))
    await wait_until(lambda: labelled(survivor) == 200, 30, "200 labels counted")
    # the killed replica's partitions' windows came along (read back at the takeover)
    assert fleet_window([survivor]) == (200.0, 0.0)
    log = survivor.tail(100_000)
    line = [ln for ln in log.splitlines() if "now read here" in ln][-1]  # the takeover
    print(f"\n{line.split(' INFO ', 1)[1]}")


@pytest.mark.parametrize("partitions", [3, 4])
async def test_a_replica_killed_and_replaced_leaves_the_fleets_coverage_windows_whole(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],  # noqa: F811
    partitions: int,
) -> None:
    """The coverage windows' counts move with the partitions: a replica killed and
    replaced took its windows (requests and labels) with it, and the fleet's sums (the
    bound's inputs) fell to what the survivor held; the replacement now reads its
    partitions' requests and labels back when it is given them (over an odd and an even
    partition count)."""
    async with two_replicas(kafka_broker, unique_topics, tmp_path, fleet, partitions) as (
        settings,
        env,
        seen,
    ):
        await send(settings, requests(settings, "q", 90, trusted=False))
        await wait_until(lambda: len(seen.reading) == 90, 45, "90 verdicts")
        await send(settings, labels(settings, [f"q-{i}" for i in range(90)]))
        await wait_until(lambda: sum(labelled(r) for r in fleet) == 90, 30, "90 labels counted")
        assert fleet_window(fleet) == (90.0, 0.0)
        killed, survivor = fleet
        assert await asyncio.to_thread(killed.signal, signal.SIGKILL) == -signal.SIGKILL
        replacement = with_metrics(env, tmp_path / "replacement.log")
        fleet.append(replacement)
        await asyncio.to_thread(replacement.start)

        def replaced() -> bool:  # the group settled without the killed replica
            return (
                holds([survivor, replacement]) == partitions and window(replacement, "requests") > 0
            )

        await wait_until(replaced, 45, "the replacement to hold partitions")
        both = [survivor, replacement]
        await wait_until(
            lambda: fleet_window(both) == (90.0, 0.0) and sum(map(labelled, both)) == 90,
            30,
            "the fleet's windows whole again: 90 requests, 90 labels",
        )
    log = replacement.tail(100_000)
    moved = [ln.split(" INFO ", 1)[1] for ln in log.splitlines() if "windows follow" in ln]
    assert moved and "label(s) of" in moved[-1], log
    print(f"\nreplacement: {moved}; its window {window(replacement, 'requests'):g} requests, "
          f"{labelled(replacement):g} labels")  # fmt: skip


def unreachable(settings: Settings) -> Settings:
    """``settings`` with a bootstrap server nothing listens on."""
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    return settings.model_copy(update={"kafka": kafka})


async def said_once(caplog: pytest.LogCaptureFixture, read: Awaitable[object]) -> str:
    """``read`` against a cluster that cannot be reached gives up in time, returns
    ``None`` and says why in one WARNING of the warm start's logger: its text."""
    caplog.set_level(logging.WARNING, logger="sidecar.kafka.warmstart")
    caplog.clear()
    started = time.monotonic()
    assert await read is None
    assert time.monotonic() - started < 15
    [warning] = [
        r.getMessage()
        for r in caplog.records
        if r.name == "sidecar.kafka.warmstart" and r.levelno >= logging.WARNING
    ]
    return warning


async def test_junk_on_the_verdicts_topic_is_skipped_and_an_unreadable_cluster_is_said(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    settings_factory: Any,
) -> None:
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, 2)
    await create_topics(settings)
    shipped = settings_factory(
        models={"dir": str(Path(__file__).parents[2] / "models")},
        signals={"lookback": False},
    )
    settings = settings.model_copy(update={"models": shipped.models})
    verdict = {
        "event_type": "answer.verdict",
        "stage": "final",
        "request_id": "r-1",
        "tenant": "default",
        "decision": "allow",
        "certificate": KEY,
        "model_versions": {"policy": "default/1@abc"},
        "signals": {
            "retrieval": RetrievalSignal(
                status=SignalStatus.OK,
                trusted_chunk_ids=["c"] * 1000,
                m1=True,
                m2=1.0,
                alpha=0.1,
                certifiable=True,
                calibration_version="cal",
                calibration_key=KEY,
                monitor="ok",
            ).model_dump(mode="json")
        },
    }
    junk: list[bytes | None] = [
        b"{not json",
        b"\xff\xfe\x00 not utf-8",
        None,  # a tombstone
        orjson.dumps([1, 2, 3]),
        orjson.dumps({**verdict, "stage": "stream"}),
        orjson.dumps({**verdict, "request_id": "x" * 5000}),
        orjson.dumps({**verdict, "signals": {"retrieval": {"alpha": 1e308}}}),
        orjson.dumps({**verdict, "tenant": 7}),
        orjson.dumps({**verdict, "decision": [1]}),  # not even hashable
        orjson.dumps({**verdict, "decision": "maybe"}),
        orjson.dumps({**verdict, "certificate": {"key": "x"}}),
        orjson.dumps({**verdict, "model_versions": {"policy": "p" * 2000}}),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        for i, value in enumerate(junk):
            await producer.send_and_wait(settings.topics.verdicts, value, key=b"j%d" % i)
        for _ in range(3):  # the same request decided three times counts once: its latest
            await producer.send_and_wait(settings.topics.verdicts, orjson.dumps(verdict))
        # a later timestamp: records of two partitions with the same millisecond have no
        # order to read back (the read sorts by timestamp, then partition)
        await asyncio.sleep(0.02)
        good = {**verdict, "request_id": "r-2"}
        await producer.send_and_wait(settings.topics.verdicts, orjson.dumps(good))
    finally:
        await producer.stop()
    back = await read_decided(settings, 1000)
    assert back.complete and back.records == len(junk) + 4
    assert back.skipped == len(junk)
    assert [d.request.request_id for d in back.decided] == ["r-1", "r-2"]
    first = back.decided[0].request
    assert first.retrieval.trusted_chunk_ids == []  # not held
    assert (first.decision, first.certificate, first.policy) == (
        Decision.ALLOW,
        KEY,
        "default/1@abc",
    )
    # only the tail: one record per partition of the two
    assert (await read_decided(settings, 2)).records == 2
    # only the requests whose inputs hash to partition 1 of 2 (both verdict partitions
    # read: their count is not the inputs' 3)
    home = partition_for("r-1", 3)
    homed = await read_decided(settings, 1000, homes=(frozenset({home}), 3))
    assert homed.records == len(junk) + 4
    want = [r for r in ("r-1", "r-2") if partition_for(r, 3) == home]
    assert [d.request.request_id for d in homed.decided] == want

    processor = Processor(settings, PlaceholderPolicy(), signals=build_signals(settings))
    done = await warm_start(settings, processor)
    assert done is not None and done.monitor is not None
    assert (done.monitor.keys, done.monitor.fed, done.remembered) == (1, 2, 2)

    # a cluster that cannot be reached: the windows start empty, said once, no error
    warning = await said_once(caplog, warm_start(unreachable(settings), processor))
    assert "windows start empty" in warning and "labels of requests" in warning
    assert "GUARDRAIL_SIGNALS__WARM_START=0" in warning


async def test_labels_read_back_skip_what_intake_refuses_and_an_unreadable_cluster_is_said(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, PARTITIONS)
    await create_topics(settings)
    good = labels(settings, ["a", "b"])
    right = orjson.dumps({**orjson.loads(good[0].value), "correct": True})
    junk: list[tuple[bytes | None, bytes | None]] = [
        (b"{not json", b"a"),
        (b"\xff\xfe\x00 not utf-8", b"a"),
        (None, b"a"),  # a tombstone
        (orjson.dumps({**orjson.loads(good[0].value), "correct": "yes"}), b"a"),
        (good[1].value, b"another-request"),  # keyed for another request
    ]
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        for value, key in junk:
            await producer.send_and_wait(settings.topics.feedback, value, key=key)
        for record in good:
            await producer.send_and_wait(settings.topics.feedback, record.value, key=record.key)
        await producer.send_and_wait(settings.topics.feedback, right, key=b"a")  # the last wins
    finally:
        await producer.stop()
    processor = Processor(settings, PlaceholderPolicy())
    every = frozenset(range(PARTITIONS))
    read = await read_labels(settings, processor, every, PARTITIONS)
    a, b = ReadLabel("a", True, False, home("a")), ReadLabel("b", False, False, home("b"))
    assert sorted(read or [], key=lambda label: label.request_key) == [a, b]
    only = frozenset({home("a")})
    assert await read_labels(settings, processor, only, PARTITIONS) == [a]

    warning = await said_once(
        caplog, read_labels(unreachable(settings), processor, every, PARTITIONS)
    )
    assert "were not read back" in warning and "coverage window starts empty" in warning


async def test_a_read_goes_on_from_where_the_reads_before_it_stopped(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """The warm start marks how far it read each verdict partition; a recall (the first
    assignment's, a rebalance's) reads only what came after. A read that kept only some
    requests of a partition (homes, partition counts unequal) leaves the marks alone."""
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, PARTITIONS)
    await create_topics(settings)

    async def verdicts(prefix: str, n: int) -> list[str]:
        ids = [f"{prefix}-{i}" for i in range(n)]
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await producer.start()
        try:
            for rid in ids:
                value = orjson.dumps(
                    {
                        "event_type": "answer.verdict",
                        "stage": "final",
                        "request_id": rid,
                        "tenant": "default",
                        "decision": "caveat",
                        "signals": {"retrieval": {"status": "ok", "m1": True, "alpha": 0.1}},
                    }
                )
                await producer.send_and_wait(settings.topics.verdicts, value, key=rid.encode())
        finally:
            await producer.stop()
        return ids

    before = await verdicts("before", 30)
    marks: dict[int, int] = {}
    first = await read_decided(settings, 1000, marks=marks)
    assert sorted(d.request.request_id for d in first.decided) == sorted(before)
    assert sum(marks.values()) == 30 and set(marks) == set(range(PARTITIONS))

    after = await verdicts("after", 12)
    target = home("after-0")
    mine = [rid for rid in after if home(rid) == target]
    again = await read_decided(settings, 1000, homes=(frozenset({target}), PARTITIONS), marks=marks)
    assert sorted(d.request.request_id for d in again.decided) == sorted(mine)
    assert again.records == len(mine)  # nothing the warm start read, read again
    assert marks[target] == sum(home(r) == target for r in before + after)

    # inputs of another partition count: every verdict partition is read and only the
    # requests of the home kept, so the marks stay where they were
    kept = dict(marks)
    other = await read_decided(settings, 1000, homes=(frozenset({0}), 2), marks=marks)
    assert marks == kept
    assert other.records == 12 - len(mine)  # the other partitions' new records only


def holds(replicas: list[SidecarProcess]) -> int:
    """The retrieval partitions the replicas' last assignments name, together."""
    held = 0
    for replica in replicas:
        lines = [ln for ln in replica.tail(200_000).splitlines() if "assigned to" in ln]
        held += len(re.findall(r"retrieval', partition=", lines[-1] if lines else ""))
    return held


@pytest.mark.parametrize("partitions", [5, 4])
async def test_the_fleets_windows_stay_whole_through_repeated_kills_and_restarts(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],  # noqa: F811
    partitions: int,
) -> None:
    """Three replicas over 5 (and 4) partitions while requests and then their labels flow;
    one is SIGKILLed and replaced, another stopped (SIGTERM) and replaced, and a third
    SIGKILLed and replaced while the labels come: every assignment moves windows, some
    more than once. When the group settles, the live replicas' windows sum to every
    request once and every label once (the windows' caps are far above these counts)."""
    n = 200
    async with two_replicas(kafka_broker, unique_topics, tmp_path, fleet, partitions, count=3) as (
        settings,
        env,
        seen,
    ):
        live = list(fleet)

        async def replace(index: int, sig: signal.Signals) -> None:
            old = live.pop(index)
            stopped = 0 if sig == signal.SIGTERM else -sig  # a stop is a clean exit
            assert await asyncio.to_thread(old.signal, sig) == stopped, old.tail()
            new = with_metrics(env, tmp_path / f"replacement-{len(fleet)}.log")
            fleet.append(new)
            live.append(new)
            await asyncio.to_thread(new.start)

        ids = [f"c-{i}" for i in range(n)]
        sender = asyncio.create_task(
            send(settings, requests(settings, "c", n, trusted=False), rate_per_s=n / 8.0)
        )
        await asyncio.sleep(2.0)
        await replace(0, signal.SIGKILL)
        await asyncio.sleep(2.0)
        await replace(0, signal.SIGTERM)
        assert await sender == 2 * n
        await wait_until(lambda: set(ids) <= set(seen.reading), 60, f"{n} verdicts")
        sender = asyncio.create_task(send(settings, labels(settings, ids), rate_per_s=n / 6.0))
        await asyncio.sleep(2.0)
        await replace(1, signal.SIGKILL)
        assert await sender == n

        def whole() -> bool:
            return (
                holds(live) == partitions
                and fleet_window(live) == (float(n), 0.0)
                and sum(map(labelled, live)) == n
            )

        try:
            await wait_until(whole, 60, f"the fleet's windows whole: {n} requests, {n} labels")
        finally:
            said = [
                (
                    window(r, "requests"),
                    labelled(r),
                    [
                        ln.split(" INFO ", 1)[1]
                        for ln in r.tail(200_000).splitlines()
                        if "windows follow" in ln
                    ],
                )
                for r in live
            ]
            print(f"\n{partitions} partitions, live replicas (requests, labels, moves): {said}")


def count(replica: SidecarProcess, name: str) -> float:
    """One of the replica's ``guardrail.<name>`` counters (its scrape), -1 when it does not
    answer."""
    metric = f"guardrail_{name.replace('.', '_')}"
    return scraped(replica, lambda sample: sample.name in (metric, f"{metric}_total"))


async def test_labels_waiting_for_their_requests_move_with_their_partitions(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],  # noqa: F811
) -> None:
    """Catching up, the feedback topic runs ahead of the inputs: one replica reads 60 labels
    before any event of their requests, and keeps them waiting. A second replica joins
    (the lag scaled the fleet out) and takes partitions over; the requests come after.
    Every label reaches its request: the new owner read its partitions' labels back and
    keeps those of requests not decided yet waiting for them (before, they were left out,
    and the old owner, which no longer reads those requests, waited in vain)."""
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, PARTITIONS)
    await create_topics(settings)
    env = {**_env(settings), "GUARDRAIL_SIGNALS__LOOKBACK": "false"}
    first = with_metrics(env, tmp_path / "first.log")
    fleet.append(first)
    await asyncio.to_thread(first.start)
    await wait_until(first.ready, 30, "the first replica ready")
    ids = [f"w-{i}" for i in range(60)]
    await send(settings, labels(settings, ids))
    await wait_until(lambda: count(first, "feedback.early") == 60, 30, "60 labels waiting")
    second = with_metrics(env, tmp_path / "second.log")
    fleet.append(second)
    await asyncio.to_thread(second.start)
    both = [first, second]
    await wait_until(
        lambda: (
            holds(both) == PARTITIONS
            and holds([second]) > 0
            and "windows follow" in second.tail(200_000)
        ),  # said after the reads back
        45,
        "the partitions shared",
    )
    log = second.tail(200_000)
    moved = [ln.split(" INFO ", 1)[1] for ln in log.splitlines() if "windows follow" in ln]
    assigned = [ln for ln in log.splitlines() if "assigned to partitions" in ln][-1]
    mine = {int(p) for p in re.findall(r"retrieval', partition=(\d+)", assigned)}
    theirs = sum(home(rid) in mine for rid in ids)
    assert moved and f"{theirs} label(s) wait for their requests" in moved[-1], (theirs, moved)
    seen = Monitor()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, stop))
    try:
        await send(settings, requests(settings, "w", 60, trusted=False))
        await wait_until(lambda: set(ids) <= set(seen.reading), 45, "60 verdicts")
    finally:
        stop.set()
        await watcher
    await wait_until(lambda: sum(map(labelled, both)) == 60, 30, "60 labels counted")
    assert labelled(second) == theirs > 0
    assert count(second, "feedback.unmatched") == 0
