"""Read a range of topics without a consumer group: what the read-only CLI commands share.

:class:`TopicScan` assigns every partition of its topics (or, given a request id, only
the one Kafka's default partitioner puts that key on: the partition every producer of
a request's records writes it to), reads each from its start or from the first record
at or after ``since`` (``offsets_for_times``) up to the end offsets taken when the scan
started, so a topic that grows while it is read cannot keep it going;
:meth:`TopicScan.follow` then reads on past them, and takes up the partitions added to a
topic meanwhile (an operator's ``kafka-topics --alter --partitions``) within
:data:`GROWTH_CHECK_S`, from their start. No offsets are committed and no sidecar's group
is disturbed. It reads committed records only (``read_committed``): a record of an
aborted transaction was written again by the retry that followed. Header names are read
leniently and a compressed batch inflates within ``GUARDRAIL_KAFKA__MAX_BATCH_INFLATED_BYTES``,
as the sidecar's own consumer reads. ``guardrail dlq inspect|redrive`` and
``guardrail verdicts`` read through it, and the sidecar's warm start
(:mod:`sidecar.kafka.warmstart`: the verdicts' tail).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Final, Self

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from guardrail_client.keys import partition_for
from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.permissions import read_refused
from sidecar.kafka.records import install_lenient_header_names
from sidecar.kafka.security import aiokafka_client_args
from sidecar.kafka.topics import refusals_said

__all__ = ["GROWTH_CHECK_S", "TopicScan"]

_POLL_MS: Final = 500
# how often the scan's consumer refreshes its metadata (aiokafka's default, 5 minutes, is
# how long a partition added while ``follow()`` ran went unread): one metadata request
# for the scan's topics each time
GROWTH_CHECK_S: Final = 5.0


class TopicScan:
    """``async with TopicScan(settings, [(topic, "GUARDRAIL_TOPICS__X")], since) as scan``:
    ``scan.to_read`` records, then ``async for record in scan.records()``.

    ``key``: read only the partition of each topic that Kafka's default partitioner
    (murmur2) puts this request id on (the records of other keys there are yielded too:
    filtering on the key is for the caller). ``homes`` (partition numbers, the partition
    count they are numbers of): of a topic with that many partitions, read only those
    (of another, every one). ``tail``: read only the last ``tail`` records, split evenly
    over the partitions read (instead of ``since``), and with ``after`` (partition -> offset)
    none before the offset given for its partition (what an earlier read already saw).
    :attr:`ends`: each partition's end offset taken at the start, where ``records()`` stops."""

    def __init__(
        self,
        settings: Settings,
        topics: Sequence[tuple[str, str]],
        since: datetime | None = None,
        *,
        key: str | None = None,
        homes: tuple[frozenset[int], int] | None = None,
        tail: int | None = None,
        after: Mapping[TopicPartition, int] | None = None,
        client_id: str = "guardrail-scan",
    ) -> None:
        self._named = list(topics)  # (topic, the setting that names it)
        self._settings = settings
        self._since = since
        self._key = key
        self._homes = homes
        self._tail = tail
        self._after = dict(after or {})
        self._client_id = client_id
        self._consumer: AIOKafkaConsumer[bytes, bytes] | None = None
        self._end: dict[TopicPartition, int] = {}
        self._counts: dict[str, int] = {}  # each topic's partitions, as follow() last saw them
        # every partition's end offset at the start: where follow() reads one it takes up
        # later from (``key``: the partition a grown topic moves the key to)
        self._follow_from: dict[TopicPartition, int] = {}
        self.to_read = 0  # records between the start positions and the end offsets
        self.cluster_topics: frozenset[str] = frozenset()  # the cluster's topics at the start
        self.cluster_counts: dict[str, int] = {}  # and their partition counts

    @property
    def ends(self) -> dict[TopicPartition, int]:
        """Each partition read and its end offset taken at the start."""
        return dict(self._end)

    @property
    def counts(self) -> dict[str, int]:
        """Each topic's partition count, as the start saw it."""
        return dict(self._counts)

    @property
    def _what(self) -> str:
        return ", ".join(f"{topic} ({setting})" for topic, setting in self._named)

    async def __aenter__(self) -> Self:
        kafka = self._settings.kafka
        # before the consumer reads anything: a header name that is not UTF-8 (anyone who may
        # write to a topic writes any header) raised out of every fetch, and a compressed
        # batch inflated whole; the sidecar's own consumer has been guarded so since
        install_lenient_header_names(
            max_batch_inflated_bytes=kafka.max_batch_inflated_bytes,
            max_poll_bytes=kafka.max_poll_bytes,
        )
        consumer = self._consumer = AIOKafkaConsumer(
            **aiokafka_client_args(kafka),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            client_id=self._client_id,
            fetch_max_wait_ms=100,
            metadata_max_age_ms=int(GROWTH_CHECK_S * 1000),
            max_partition_fetch_bytes=self._settings.topics.max_message_bytes + 65_536,
        )
        timeout_s = kafka.request_timeout_ms / 1000.0
        try:
            with refusals_said(kafka):
                async with asyncio.timeout(timeout_s):
                    await self._open(consumer)
        except (KafkaError, OSError, TimeoutError) as exc:
            await self._stop()
            raise BrokerError(
                f"cannot read {self._what} at {kafka.bootstrap_servers} "
                f"within {timeout_s:g} s: {exc or type(exc).__name__}"
            ) from None
        except BaseException:
            await self._stop()
            raise
        return self

    async def _open(self, consumer: AIOKafkaConsumer[bytes, bytes]) -> None:
        await consumer.start()
        # what ``topics()`` fetches (metadata for every topic), keeping the partition counts
        cluster = await consumer._client.fetch_all_metadata()
        self.cluster_topics = frozenset(cluster.topics())
        self.cluster_counts = {
            t: len(cluster.partitions_for_topic(t) or ()) for t in self.cluster_topics
        }
        for topic, setting in self._named:
            if topic not in self.cluster_topics:
                raise ConfigError(
                    f"topic {topic} ({setting}) does not exist on "
                    f"{self._settings.kafka.bootstrap_servers}; create it first "
                    "(`guardrail topics create`)"
                )
        wanted = {topic for topic, _ in self._named}
        consumer.subscribe(sorted(wanted))  # no group: every partition is assigned
        while {tp.topic for tp in consumer.assignment()} != wanted:  # noqa: ASYNC110 (no event)
            await asyncio.sleep(0.01)
        self._counts = {t: len(consumer.partitions_for_topic(t) or ()) for t in sorted(wanted)}
        every = [TopicPartition(t, p) for t, n in self._counts.items() for p in range(n)]
        tps = self._partitions(self._counts)
        # assigned by hand: subscribed, a metadata refresh that shows a grown topic has
        # aiokafka assign every partition afresh, the old ones read again from their start
        consumer.unsubscribe()
        consumer.assign(tps)
        self._follow_from = await consumer.end_offsets(every)
        self._end = {tp: self._follow_from[tp] for tp in tps}
        if self._tail is not None and tps:
            starts = await consumer.beginning_offsets(tps)
            each = math.ceil(self._tail / len(tps))
            for tp in tps:
                first = max(starts[tp], self._end[tp] - each, self._after.get(tp, 0))
                consumer.seek(tp, min(first, self._end[tp]))
        elif self._since is None:
            await consumer.seek_to_beginning(*tps)
        else:
            ms = int(self._since.timestamp() * 1000)
            found = await consumer.offsets_for_times(dict.fromkeys(tps, ms))
            for tp in tps:
                at = found.get(tp)
                consumer.seek(tp, self._end[tp] if at is None else min(at.offset, self._end[tp]))
        for tp in tps:
            self.to_read += max(0, self._end[tp] - await consumer.position(tp))

    def _partitions(self, counts: dict[str, int]) -> list[TopicPartition]:
        """The partitions to read of topics with these partition counts: every one, or with
        ``key`` the one where every producer of the request's records puts them."""
        if self._key is not None:
            return [TopicPartition(t, partition_for(self._key, n)) for t, n in counts.items()]
        wanted, count = self._homes if self._homes is not None else (frozenset(), -1)
        return [
            TopicPartition(t, p)
            for t, n in counts.items()
            for p in range(n)
            if n != count or p in wanted
        ]

    async def records(self) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
        """The records up to the end offsets taken at the start, in offset order within
        each partition."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("TopicScan.records() outside `async with`")
        end = self._end
        behind = [tp for tp in end if await consumer.position(tp) < end[tp]]
        stalled_s = 0.0
        limit_s = self._settings.kafka.request_timeout_ms / 1000.0
        while behind:
            try:
                batch = await consumer.getmany(*behind, timeout_ms=_POLL_MS)
            except KafkaError as exc:
                raise BrokerError(
                    f"reading {self._what} failed: {exc}{read_refused(self._settings, exc)}"
                ) from None
            stalled_s = 0.0 if batch else stalled_s + _POLL_MS / 1000.0
            for tp, records in batch.items():
                for r in records:
                    if r.offset < end[tp]:
                        yield r
            before = behind
            behind = [tp for tp in behind if await consumer.position(tp) < end[tp]]
            if behind == before and stalled_s >= limit_s:
                at = [f"{tp.topic}[{tp.partition}]@{await consumer.position(tp)}" for tp in behind]
                ends = [f"{tp.topic}[{tp.partition}]@{end[tp]}" for tp in behind]
                raise BrokerError(
                    f"reading {self._what} made no progress for {stalled_s:g} s at "
                    f"{', '.join(at)} (the end offsets taken at the start: {', '.join(ends)})"
                )

    async def follow(self) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
        """After :meth:`records`: the records written past the end offsets taken at the start,
        as they come, until cancelled. A partition added to a topic meanwhile is read from its
        start, within :data:`GROWTH_CHECK_S` of being added (with ``key``: the partition the
        grown topic puts the key on, read from the end offset it had when the scan started,
        the old one read on too)."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("TopicScan.follow() outside `async with`")
        for tp, end in self._end.items():  # records() dropped what it fetched past the end
            if await consumer.position(tp) > end:
                consumer.seek(tp, end)
        while True:
            try:
                batch = await consumer.getmany(timeout_ms=_POLL_MS)
            except KafkaError as exc:
                raise BrokerError(
                    f"reading {self._what} failed: {exc}{read_refused(self._settings, exc)}"
                ) from None
            for records in batch.values():
                for r in records:
                    yield r
            await self._take_up_new_partitions(consumer)

    async def _take_up_new_partitions(self, consumer: AIOKafkaConsumer[bytes, bytes]) -> None:
        """Read the partitions that the consumer's last metadata refresh shows were added,
        the others on from where they are."""
        counts = {t: len(consumer.partitions_for_topic(t) or ()) for t in self._counts}
        if all(counts[t] <= n for t, n in self._counts.items()):
            return  # a topic never shrinks: fewer is metadata not known at the moment
        self._counts = {t: max(n, counts[t]) for t, n in self._counts.items()}
        held = consumer.assignment()
        added = [tp for tp in self._partitions(self._counts) if tp not in held]
        if not added:
            return
        at = {tp: await consumer.position(tp) for tp in held}  # the next record to yield
        consumer.assign(sorted({*held, *added}))  # a fresh assignment: positions are lost
        for tp, offset in at.items():
            consumer.seek(tp, offset)
        for tp in added:
            if tp in self._follow_from:
                consumer.seek(tp, self._follow_from[tp])
        new = [tp for tp in added if tp not in self._follow_from]
        if new:
            await consumer.seek_to_beginning(*new)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await self._consumer.stop()
            self._consumer = None
