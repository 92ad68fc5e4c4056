"""At start, the requests the fleet decided before: read back from the verdicts topic.

Two things the sidecar keeps in memory were lost with the process:

* The exchangeability monitor (docs/methods.md §Retrieval certification) judges a
  calibration key by the rolling mean(m1) of its last ``GUARDRAIL_SIGNALS__MONITOR_WINDOW``
  decided retrievals. A restart emptied it: the alarm that caveats every answer of a key
  whose retriever stopped ranking correct chunks into the top K went off with the
  process and stayed off while the new window warmed up (50 requests), or for good while
  the window's mean sat between the Wilson bound and 1 - alpha (the hysteresis band). A
  rolling update or a crash-looping pod served those answers without the caveat.
* The coverage monitor matches a feedback label to the request it labels by the requests
  this process decided. A label that came after a restart (labels come after their
  answers), or at the replica its request's partition moved to, matched nothing and was
  counted unmatched: lost to the coverage bound, and a certified allow's label to its
  certificate's re-test.

Every final verdict carries what both need: its retrieval signal (m1, alpha, calibration,
key, the monitor's reading), its tenant, decision, allow certificate and policy. Before
the sidecar reads its first input, :func:`warm_start` reads the verdicts topic's tail,
the last ``GUARDRAIL_SIGNALS__WARM_START`` records over its partitions (no group, nothing
committed, read-committed), and hands the final verdicts, oldest first and one per
request, to ``Processor.warm_start``: the monitor's windows are refilled and judged with
the latest verdict's reading; the coverage monitor keeps the requests for their labels
(not counted as requests: the replica that decided them did). Every replica reads the
whole fleet's tail.

A partition given to this replica later (and at its first assignment: the partition's
last owner went on deciding between this start's read and the join) brings the labels of
requests another replica decided there: :func:`recall` reads that partition's requests
back, from where this process had read it (:data:`ReadMarks`), so the first assignment
reads only what the fleet decided since the start.

Bounded: at most the configured number of records and :data:`TIMEOUT_S`; what was read
by then is used. Never fatal: a cluster that refuses (no Read on the verdicts topic) or
does not answer leaves both empty, with one warning that says why. Records that are not
final answer verdicts, or whose fields do not validate, are skipped and counted. Whoever
can write the verdicts topic can set a starting replica's alarm or label lookup, as they
can already tell the LLM service what to show: restrict it (Kafka ACLs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from guardrail_client.keys import partition_for
from sidecar.config import Settings
from sidecar.contracts.events import Decision, RetrievalSignal
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.permissions import read_refused
from sidecar.kafka.records import input_headers
from sidecar.kafka.scan import TopicScan
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.ports import DecidedRequest, ReadLabel, WarmStart
from sidecar.pipeline.processor import Processor

__all__ = [
    "RECALL_TIMEOUT_S",
    "TIMEOUT_S",
    "Decided",
    "ReadBack",
    "ReadMarks",
    "decided",
    "read_decided",
    "read_labels",
    "recall",
    "warm_start",
]

log = logging.getLogger("sidecar.kafka.warmstart")

TIMEOUT_S: Final = 10.0
"""The longest the read may take; what came by then is used (a start is not held longer)."""

ReadMarks = dict[int, int]
"""Verdict partition -> the offset this process has read it to (warm start, recalls)."""

_MAX_ID_CHARS: Final = 1024  # request ids, tenants, keys: a verdict's are far shorter


@dataclass(frozen=True, slots=True)
class Decided:
    """One final verdict's request, and where it was read."""

    timestamp_ms: int
    partition: int
    offset: int
    request: DecidedRequest


@dataclass(frozen=True, slots=True)
class ReadBack:
    """What :func:`read_decided` found: one ``Decided`` per request, oldest first."""

    decided: list[Decided]
    records: int  # records read
    skipped: int  # records that are not a final answer verdict whose fields validate
    complete: bool  # every partition read to its end (not cut by the time limit)
    seconds: float
    input_partitions: int | None = None  # the retrieval topic's partition count, if known


def decided(record: ConsumerRecord[bytes, bytes]) -> Decided | None:
    """The record's final answer verdict as the warm start keeps it; ``None`` for anything
    else (a stream verdict, another event, junk, a field that does not validate). Keeps
    the retrieval signal without its chunk ids: a read holds up to 200,000 (~1 KB each)."""
    event = _json_object(record.value)
    if event is None or (event.get("event_type"), event.get("stage")) != (
        "answer.verdict",
        "final",
    ):
        return None
    request_id, tenant = event.get("request_id"), event.get("tenant")
    certificate, said = event.get("certificate"), event.get("decision")
    decision = _DECISIONS.get(said) if isinstance(said, str) else None  # [1] is unhashable
    signals, versions = event.get("signals"), event.get("model_versions")
    retrieval = signals.get("retrieval") if isinstance(signals, dict) else None
    policy = versions.get("policy") if isinstance(versions, dict) else None
    if (
        not isinstance(request_id, str)
        or not _fits(request_id)
        or not all(_fits_or_none(text) for text in (tenant, certificate, policy))
        or decision is None
        or not isinstance(retrieval, dict)
        or not all(_fits_or_none(retrieval.get(name)) for name in _NAMES)
    ):
        return None
    try:
        signal = RetrievalSignal.model_validate({**retrieval, "trusted_chunk_ids": []})
    except ValidationError:
        return None
    request = DecidedRequest(request_id, tenant, decision, signal, certificate, policy)
    return Decided(record.timestamp, record.partition, record.offset, request)


_NAMES: Final = ("calibration_key", "calibration_version", "fallback_reason")
_DECISIONS: Final = {d.value: d for d in Decision}


def _json_object(value: bytes | None) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        found = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def _fits(text: str) -> bool:
    return 0 < len(text) <= _MAX_ID_CHARS


def _fits_or_none(value: object) -> bool:
    return value is None or (isinstance(value, str) and _fits(value))


async def read_decided(
    settings: Settings,
    records: int,
    *,
    timeout_s: float = TIMEOUT_S,
    homes: tuple[frozenset[int], int] | None = None,
    marks: ReadMarks | None = None,
) -> ReadBack:
    """The last ``records`` records of the verdicts topic (split evenly over its
    partitions) as final verdicts, one per request (its latest), oldest first.

    ``homes`` (partition numbers, the input topics' partition count): only requests whose
    inputs hash to those partitions (murmur2 of the request id, as the producers and the
    verdicts are keyed); with as many verdict partitions as input partitions, only those
    verdict partitions are read.

    ``marks`` (verdict partition -> offset): where this process has read each partition to
    already; the read starts no earlier, and moves the marks of the partitions whose every
    request it kept (all of them, or with ``homes`` the home partitions when the counts are
    equal) to where it got.

    ``BrokerError`` / ``ConfigError`` (:class:`~sidecar.kafka.scan.TopicScan`'s) when the
    cluster refuses or cannot be reached, ``TimeoutError`` when nothing came in time."""
    started = time.monotonic()
    topic = settings.topics.verdicts
    latest: dict[tuple[str | None, str], Decided] = {}
    read = skipped = 0
    complete = whole = False
    inputs: int | None = None
    ends: dict[int, int] = {}
    reached: dict[int, int] = {}  # per partition: past the last record read
    try:
        async with asyncio.timeout(timeout_s):
            async with TopicScan(
                settings,
                [(topic, "GUARDRAIL_TOPICS__VERDICTS")],
                homes=homes,
                tail=records,
                after={TopicPartition(topic, p): at for p, at in (marks or {}).items()},
                client_id="guardrail-warm-start",
            ) as scan:
                ends = {tp.partition: end for tp, end in scan.ends.items()}
                inputs = scan.cluster_counts.get(settings.topics.retrieval) or None
                whole = homes is None or scan.counts.get(topic) == homes[1]
                async for record in scan.records():
                    read += 1
                    reached[record.partition] = record.offset + 1
                    found = decided(record)
                    if found is None:
                        skipped += 1
                    elif homes is None or _home(found.request, homes):
                        latest[(found.request.tenant, found.request.request_id)] = found
            complete = True
    except TimeoutError:
        if not read:
            raise  # nothing came: the caller says the cluster did not answer
    if marks is not None and whole:
        for partition, at in (ends if complete else reached).items():
            marks[partition] = max(marks.get(partition, 0), at)
    ordered = sorted(latest.values(), key=lambda d: (d.timestamp_ms, d.partition, d.offset))
    return ReadBack(ordered, read, skipped, complete, time.monotonic() - started, inputs)


def _home(request: DecidedRequest, homes: tuple[frozenset[int], int]) -> bool:
    partitions, count = homes
    return partition_for(request.request_id, count) in partitions


async def warm_start(
    settings: Settings, processor: Processor, marks: ReadMarks | None = None
) -> WarmStart | None:
    """Give ``processor`` the requests decided before it started, read back from the
    verdicts topic's tail (see the module); ``None`` when it was not read (off, refused,
    unreachable: said once). ``marks``: :func:`read_decided`'s, for the recalls after."""
    records = settings.signals.warm_start
    if records <= 0:
        return None
    topic = settings.topics.verdicts
    try:
        back = await read_decided(settings, records, marks=marks)
    except (BrokerError, ConfigError, KafkaError, OSError, TimeoutError) as exc:
        why = str(exc) or type(exc).__name__
        log.warning(
            "the warm start did not read %s back (%s)%s: the exchangeability monitor's "
            "windows start empty (a key whose alarm was on is judged afresh) and labels of "
            "requests decided before this start go unmatched (GUARDRAIL_TOPICS__VERDICTS; "
            "GUARDRAIL_SIGNALS__WARM_START=0 skips the read)",
            topic, why, read_refused(settings, exc),
        )  # fmt: skip
        return None
    done = processor.warm_start([d.request for d in back.decided], back.input_partitions)
    seed = done.monitor
    log.info(
        "warm start: the last %d record(s) of %s read in %.2f s%s%s; %s; %d request(s) kept "
        "for their labels%s",
        back.records, topic, back.seconds,
        f" ({back.skipped} not a final verdict)" if back.skipped else "",
        "" if back.complete else f", cut at {TIMEOUT_S:g} s",
        "no exchangeability monitor" if seed is None else (
            f"exchangeability monitor: {seed.fed} decided retrieval(s) of {seed.keys} key(s)"
        ),
        done.remembered,
        f"; alarm on: {', '.join(seed.broken)}" if seed is not None and seed.broken else "",
    )  # fmt: skip
    return done


RECALL_TIMEOUT_S: Final = 5.0
"""The longest a rebalance's read may take: records wait for it (as for the handovers)."""


async def recall(
    settings: Settings,
    processor: Processor,
    partitions: frozenset[int],
    input_partitions: int,
    marks: ReadMarks | None = None,
) -> int | None:
    """Partitions this replica was just given (a replica gone, a scale-down) bring the
    labels of requests another replica decided there, after this one's start: read
    those requests back from the verdicts topic's tail and give them to the coverage
    monitor for their labels (``Processor.recall_decided``). Returns how many were kept;
    ``None`` when not read (said once). ``marks``: what the warm start and the recalls
    before read already is not read again (:func:`read_decided`)."""
    records = settings.signals.warm_start
    if records <= 0 or not partitions:
        return None
    try:
        back = await read_decided(
            settings,
            records,
            timeout_s=RECALL_TIMEOUT_S,
            homes=(partitions, input_partitions),
            marks=marks,
        )
    except (BrokerError, ConfigError, KafkaError, OSError, TimeoutError) as exc:
        log.warning(
            "labels of requests decided elsewhere on the partitions %s, now read here, go "
            "unmatched: %s was not read back (%s)%s",
            sorted(partitions), settings.topics.verdicts, str(exc) or type(exc).__name__,
            read_refused(settings, exc),
        )  # fmt: skip
        return None
    kept = processor.recall_decided([d.request for d in back.decided], input_partitions)
    log.info(
        "partitions %s now read here: %d request(s) decided there kept for their labels "
        "(%d record(s) of %s read in %.2f s%s%s)",
        sorted(partitions), kept, back.records, settings.topics.verdicts, back.seconds,
        ", past what this process had read" if marks else "",
        "" if back.complete else f", cut at {RECALL_TIMEOUT_S:g} s",
    )  # fmt: skip
    return kept


async def read_labels(
    settings: Settings,
    processor: Processor,
    partitions: frozenset[int],
    input_partitions: int,
) -> list[ReadLabel] | None:
    """The labels of the feedback topic's tail on ``partitions`` (of ``input_partitions``),
    for the coverage windows of partitions just assigned here (``Processor.hold_partitions``):
    the last of each request, oldest first; each read as intake takes it when consumed
    (one it refuses is skipped). The last
    ``GUARDRAIL_SIGNALS__WARM_START`` records over those partitions, at most
    :data:`RECALL_TIMEOUT_S`; ``None`` when not read (said once). Labels past the
    partition's committed offset are consumed again afterwards: the same request's label,
    it replaces itself, counted neither twice nor in ``guardrail.feedback.replaced``."""
    records = settings.signals.warm_start
    if records <= 0 or not partitions:
        return None
    topic = settings.topics.feedback
    started = time.monotonic()
    latest: dict[str, ReadLabel] = {}
    read = skipped = 0
    complete = False
    try:
        async with asyncio.timeout(RECALL_TIMEOUT_S):
            async with TopicScan(
                settings,
                [(topic, "GUARDRAIL_TOPICS__FEEDBACK")],
                homes=(partitions, input_partitions),
                tail=records,
                client_id="guardrail-label-read",
            ) as scan:
                count = scan.counts.get(topic, 0)
                async for record in scan.records():
                    read += 1
                    ref = InputRef(
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        headers=input_headers(record.headers),
                        timestamp_ms=record.timestamp,
                        partitions=count,
                    )
                    found = processor.read_back_label(record.value, record.key, ref)
                    if found is None:
                        skipped += 1
                        continue
                    latest.pop(found.request_key, None)  # the last label of a request wins
                    latest[found.request_key] = found
            complete = True
    except TimeoutError:
        if not read:
            log.warning(
                "labels on the partitions %s, now read here, were not read back from %s "
                "within %g s: their coverage window starts empty",
                sorted(partitions), topic, RECALL_TIMEOUT_S,
            )  # fmt: skip
            return None
    except (BrokerError, ConfigError, KafkaError, OSError) as exc:
        log.warning(
            "labels on the partitions %s, now read here, were not read back from %s (%s)%s: "
            "their coverage window starts empty",
            sorted(partitions), topic, str(exc) or type(exc).__name__,
            read_refused(settings, exc),
        )  # fmt: skip
        return None
    log.info(
        "partitions %s now read here: %d label(s) of %s read back in %.2f s%s%s",
        sorted(partitions), len(latest), topic, time.monotonic() - started,
        f" ({skipped} refused, as when consumed)" if skipped else "",
        "" if complete else f", cut at {RECALL_TIMEOUT_S:g} s",
    )  # fmt: skip
    return list(latest.values())
