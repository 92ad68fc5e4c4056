"""The dead-letter topic over Kafka: read a range of it, send dead letters back.

:class:`DlqScan` reads the DLQ through :class:`~sidecar.kafka.scan.TopicScan`: without
joining a consumer group, every partition from its start (or ``since``) up to the end
offsets taken when the scan started, committed records only (a dead letter of an
aborted transaction was written again by the retry that followed), header names read
leniently and compressed batches inflated within bounds.

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

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from sidecar.config import Settings
from sidecar.dlq.letters import DeadLetter, read_dead_letter, redriven_headers
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.scan import TopicScan
from sidecar.kafka.security import aiokafka_client_args
from sidecar.kafka.topics import refusals_said

__all__ = ["MAX_UNCONFIRMED", "DlqScan", "Redriver"]

MAX_UNCONFIRMED: Final = 1_000


class DlqScan(TopicScan):
    """``async with DlqScan(settings, since) as scan``: ``scan.to_read`` records, then
    ``async for letter in scan.letters()`` (a :class:`~sidecar.kafka.scan.TopicScan` of
    the DLQ)."""

    def __init__(self, settings: Settings, since: datetime | None = None) -> None:
        self.topic = settings.topics.dlq
        super().__init__(
            settings, [(self.topic, "GUARDRAIL_TOPICS__DLQ")], since, client_id="guardrail-dlq"
        )

    async def letters(self) -> AsyncIterator[DeadLetter]:
        """The dead letters up to the end offsets taken at the start, in partition order
        within each partition."""
        async for r in self.records():
            yield read_dead_letter(
                partition=r.partition,
                offset=r.offset,
                timestamp_ms=r.timestamp,
                key=r.key,
                value=r.value,
                headers=r.headers,
            )


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
