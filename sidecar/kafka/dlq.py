"""The dead-letter topic over Kafka: read a range of it, send dead letters back.

:class:`DlqScan` reads the DLQ without joining a consumer group (no offsets are
committed, no sidecar's group is disturbed): every partition is assigned, read from
its start or from the first record at or after ``since`` (``offsets_for_times``) up
to the end offsets taken when the scan started, so a DLQ that grows while it is read
cannot keep it going. It reads committed records only (``read_committed``): a dead
letter of an aborted transaction was written again by the retry that followed. Header
names are read leniently and a compressed batch inflates within
``GUARDRAIL_KAFKA__MAX_BATCH_INFLATED_BYTES``, as the sidecar's own consumer reads.

:class:`Redriver` sends a dead letter's original bytes, key and headers to its source
topic through an idempotent producer (``acks=all``), holding at most
:data:`MAX_UNCONFIRMED` sends unconfirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Collection
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from sidecar.config import Settings
from sidecar.dlq.letters import DeadLetter, read_dead_letter, redriven_headers
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.records import install_lenient_header_names
from sidecar.kafka.security import aiokafka_client_args
from sidecar.kafka.topics import refusals_said

__all__ = ["MAX_UNCONFIRMED", "DlqScan", "Redriver"]

MAX_UNCONFIRMED: Final = 1_000
_POLL_MS: Final = 500


class DlqScan:
    """``async with DlqScan(settings, since) as scan``: ``scan.to_read`` records, then
    ``async for letter in scan.letters()``."""

    def __init__(self, settings: Settings, since: datetime | None = None) -> None:
        self.topic = settings.topics.dlq
        self._settings = settings
        self._since = since
        self._consumer: AIOKafkaConsumer[bytes, bytes] | None = None
        self._end: dict[TopicPartition, int] = {}
        self.to_read = 0  # records between the start positions and the end offsets
        self.topics: frozenset[str] = frozenset()  # the cluster's topics when it started

    async def __aenter__(self) -> Self:
        kafka = self._settings.kafka
        # before the consumer reads anything: a header name that is not UTF-8 (anyone who may
        # write to the DLQ writes any header) raised out of every fetch, and a compressed
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
            client_id="guardrail-dlq",
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=self._settings.topics.max_message_bytes + 65_536,
        )
        timeout_s = kafka.request_timeout_ms / 1000.0
        try:
            with refusals_said(kafka):
                await asyncio.wait_for(self._open(consumer), timeout=timeout_s)
        except (KafkaError, OSError, TimeoutError) as exc:
            await self._stop()
            raise BrokerError(
                f"cannot read {self.topic} (GUARDRAIL_TOPICS__DLQ) at {kafka.bootstrap_servers} "
                f"within {timeout_s:g} s: {exc or type(exc).__name__}"
            ) from None
        except BaseException:
            await self._stop()
            raise
        return self

    async def _open(self, consumer: AIOKafkaConsumer[bytes, bytes]) -> None:
        await consumer.start()
        self.topics = frozenset(await consumer.topics())  # a metadata request for every topic
        if self.topic not in self.topics:
            raise ConfigError(
                f"topic {self.topic} (GUARDRAIL_TOPICS__DLQ) does not exist on "
                f"{self._settings.kafka.bootstrap_servers}; create it first "
                "(`guardrail topics create`)"
            )
        consumer.subscribe([self.topic])  # no group: every partition is assigned
        while not consumer.assignment():  # noqa: ASYNC110 (no event for it without a group)
            await asyncio.sleep(0.01)
        tps = sorted(consumer.assignment())
        self._end = await consumer.end_offsets(tps)
        if self._since is None:
            await consumer.seek_to_beginning(*tps)
        else:
            ms = int(self._since.timestamp() * 1000)
            found = await consumer.offsets_for_times(dict.fromkeys(tps, ms))
            for tp in tps:
                at = found.get(tp)
                consumer.seek(tp, self._end[tp] if at is None else min(at.offset, self._end[tp]))
        for tp in tps:
            self.to_read += max(0, self._end[tp] - await consumer.position(tp))

    async def letters(self) -> AsyncIterator[DeadLetter]:
        """The dead letters up to the end offsets taken at the start, in partition order
        within each partition."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("DlqScan.letters() outside `async with`")
        end = self._end
        behind = [tp for tp in end if await consumer.position(tp) < end[tp]]
        stalled_s = 0.0
        limit_s = self._settings.kafka.request_timeout_ms / 1000.0
        while behind:
            try:
                batch = await consumer.getmany(*behind, timeout_ms=_POLL_MS)
            except KafkaError as exc:
                raise BrokerError(f"reading {self.topic} failed: {exc}") from None
            stalled_s = 0.0 if batch else stalled_s + _POLL_MS / 1000.0
            for tp, records in batch.items():
                for r in records:
                    if r.offset < end[tp]:
                        yield read_dead_letter(
                            partition=r.partition,
                            offset=r.offset,
                            timestamp_ms=r.timestamp,
                            key=r.key,
                            value=r.value,
                            headers=r.headers,
                        )
            before = behind
            behind = [tp for tp in behind if await consumer.position(tp) < end[tp]]
            if behind == before and stalled_s >= limit_s:
                at = [f"{tp.partition}@{await consumer.position(tp)}" for tp in behind]
                ends = [f"{tp.partition}@{end[tp]}" for tp in behind]
                raise BrokerError(
                    f"reading {self.topic} made no progress for {stalled_s:g} s at "
                    f"partition@offset {', '.join(at)} (the end offsets taken at the start: "
                    f"{', '.join(ends)})"
                )

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await self._consumer.stop()
            self._consumer = None


class Redriver:
    """``async with Redriver(settings) as r: await r.send(letter)``: the original bytes,
    key and headers to the source topic; the key's partition (the default partitioner,
    murmur2, as every producer of the inputs), the source partition for a record
    without a key (the request id's, as a key's, when that partition is gone). Leaving
    the block waits for every send to be confirmed."""

    def __init__(self, settings: Settings, input_topics: Collection[str]) -> None:
        self._settings = settings
        self._input_topics = frozenset(input_topics)
        if settings.topics.dlq in self._input_topics:  # never fed back into the DLQ
            raise ConfigError(f"the DLQ topic {settings.topics.dlq} is not an input topic")
        self._producer: AIOKafkaProducer | None = None
        self._unconfirmed: deque[asyncio.Future[Any]] = deque()
        self.sent = 0

    async def __aenter__(self) -> Self:
        kafka = self._settings.kafka
        producer = self._producer = AIOKafkaProducer(
            **aiokafka_client_args(kafka),
            acks="all",
            enable_idempotence=True,
            client_id="guardrail-dlq-redrive",
            max_request_size=self._settings.topics.max_message_bytes + 65_536,
        )
        try:
            with refusals_said(kafka):
                await producer.start()
        except ConfigError:
            await self._stop()
            raise
        except (KafkaError, OSError) as exc:
            await self._stop()
            raise BrokerError(
                f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc} "
                "(GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS)"
            ) from None
        return self

    async def send(self, letter: DeadLetter) -> None:
        producer = self._producer
        topic = letter.source_topic
        if producer is None or topic is None or topic not in self._input_topics:
            raise RuntimeError(f"not an input topic, or outside `async with`: {topic}")
        partition = None
        if letter.key is None:
            known = sorted(await producer.partitions_for(topic))
            if letter.source_partition in known:
                partition = letter.source_partition
            elif letter.request_id is not None and known:
                # its source partition is gone (the topic made again with fewer): where the
                # key would go, so a request's two keyless halves still meet (a random
                # partition each split them)
                index = (murmur2(letter.request_id.encode()) & 0x7FFFFFFF) % len(known)
                partition = known[index]
        try:
            future = await producer.send(
                topic,
                letter.value,
                key=letter.key,
                headers=redriven_headers(letter),
                partition=partition,
            )
        except KafkaError as exc:
            raise BrokerError(
                f"sending {letter.request_id or '?'} to {topic} failed: {exc}"
            ) from None
        self._unconfirmed.append(future)
        while len(self._unconfirmed) > MAX_UNCONFIRMED:
            await self._confirm_one()

    async def _confirm_one(self) -> None:
        future = self._unconfirmed[0]
        try:
            await future
        except KafkaError as exc:  # left among the unconfirmed: it may have been written
            raise BrokerError(f"a redriven dead letter was not confirmed: {exc}") from None
        self._unconfirmed.popleft()
        self.sent += 1

    @property
    def unconfirmed(self) -> int:
        """Sends handed to the producer whose outcome is not known (after a failure: they
        may or may not have been written)."""
        return len(self._unconfirmed)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if et is None:
                while self._unconfirmed:
                    await self._confirm_one()
        finally:
            await self._stop()  # flushes what it can
            self._settle()

    def _settle(self) -> None:
        """After a failure or an interruption: the sends confirmed by then counted as sent,
        the rest left :attr:`unconfirmed`."""
        pending: deque[asyncio.Future[Any]] = deque()
        for future in self._unconfirmed:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.sent += 1
            else:
                pending.append(future)
        self._unconfirmed = pending

    async def _stop(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await self._producer.stop()
            self._producer = None
