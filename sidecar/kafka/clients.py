"""The loop's port to Kafka: what it needs from the consumer and the producer, real and in memory.

The service asks its consumer to pause and resume partitions, commit offsets,
tell high-water marks, positions and partition counts, and its producer to
send a record and to tell each topic's ``max.message.bytes``. ``AiokafkaClients``
does that with the group consumer FastStream started and a producer of its
own; ``MemoryClients`` does it for FastStream's ``TestKafkaBroker``, where no
consumer fetches (pauses are recorded, commits kept) and records go through
the in-memory broker (header values as text: it cannot carry other bytes).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from faststream.kafka import KafkaBroker

from sidecar.config import KafkaSettings
from sidecar.exceptions import BrokerError
from sidecar.kafka.security import aiokafka_client_args

log = logging.getLogger("sidecar.kafka")

TP = tuple[str, int]
Headers = Sequence[tuple[str, bytes]]

# aiokafka's retry_backoff_ms: the Java producer waits as long between metadata refreshes
METADATA_REFRESH_BACKOFF_S = 0.1


class ConsumerPort(Protocol):
    """What the loop needs from the group consumer."""

    def assignment(self) -> set[TP]: ...

    def pause(self, partitions: Iterable[TP]) -> None: ...

    def resume(self, partitions: Iterable[TP]) -> None: ...

    async def commit(
        self, offsets: Mapping[TP, int], metadata: Mapping[TP, str] | None = None
    ) -> None:
        """Commit ``offsets`` for the group, each with its ``metadata`` text (default "")."""
        ...

    async def committed_metadata(self, partitions: Iterable[TP]) -> dict[TP, tuple[int, str]]:
        """The group's committed offset and metadata of each of ``partitions`` that has one."""
        ...

    def highwater(self, tp: TP) -> int | None:
        """The end of what the consumer can read of the partition, as of the last fetch:
        the last stable offset when it reads committed records, else the high-water mark
        (``None``: not fetched yet)."""
        ...

    def position(self, tp: TP) -> int | None:
        """The offset of the next record the consumer will hand out: one past the last it
        handed out and past what it skipped since (``None``: revoked, or not known yet)."""
        ...

    def known_partitions(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition counts from the consumer's current metadata (topics it knows only)."""
        ...

    async def fetch_partitions(self, topics: Iterable[str]) -> dict[str, int] | None:
        """Partition counts from a fresh metadata request (raises when the cluster is away);
        ``None`` when there is no cluster to ask (in memory)."""
        ...

    def refresh_metadata(self) -> None:
        """Have the consumer fetch the cluster's metadata now (it does every 5 min): a group
        member that sees a topic's new partitions makes the group rebalance onto them."""
        ...


class ProducerPort(Protocol):
    """What the publisher needs from the producer."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self, topic: str, value: bytes, key: bytes | None, headers: Headers
    ) -> Awaitable[Any]:
        """Hand one record over; returns what confirms it (awaiting it raises on failure)."""
        ...

    async def topic_limits(self, topics: Iterable[str]) -> dict[str, int]:
        """Each topic's own ``max.message.bytes`` (those it could read)."""
        ...

    async def limit_batches(self, max_bytes: int) -> None:
        """Before ``start``: no record batch larger than ``max_bytes`` (the broker checks a
        topic's ``max.message.bytes`` per batch, not per record)."""
        ...

    async def reset(self, max_batch_bytes: int | None = None) -> None:
        """Replace the producer by a fresh one (a new idempotent session), its batches at
        most ``max_batch_bytes`` when given; records handed to the old one are flushed,
        and what it cannot deliver fails its confirmation."""
        ...


@dataclass(frozen=True, slots=True)
class KafkaClients:
    consumer: ConsumerPort
    producer: ProducerPort


# --------------------------------------------------------------------------- aiokafka


class AiokafkaConsumerPort:
    """The group consumer of a started FastStream subscriber (aiokafka's)."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer

    def assignment(self) -> set[TP]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def pause(self, partitions: Iterable[TP]) -> None:
        self._consumer.pause(*(TopicPartition(*tp) for tp in partitions))

    def resume(self, partitions: Iterable[TP]) -> None:
        self._consumer.resume(*(TopicPartition(*tp) for tp in partitions))

    async def commit(
        self, offsets: Mapping[TP, int], metadata: Mapping[TP, str] | None = None
    ) -> None:
        texts = metadata or {}
        await self._consumer.commit(
            {
                TopicPartition(*tp): OffsetAndMetadata(off, texts.get(tp, ""))
                for tp, off in offsets.items()
            }
        )

    async def committed_metadata(self, partitions: Iterable[TP]) -> dict[TP, tuple[int, str]]:
        # ``AIOKafkaConsumer.committed`` returns the offset only; its coordinator has both
        wanted = [TopicPartition(*tp) for tp in partitions]
        if not wanted:
            return {}
        found = await self._consumer._coordinator.fetch_committed_offsets(wanted)
        return {
            (tp.topic, tp.partition): (int(at.offset), str(at.metadata or ""))
            for tp, at in found.items()
            if at.offset is not None and at.offset >= 0
        }

    def highwater(self, tp: TP) -> int | None:
        partition = TopicPartition(*tp)
        # read_committed stops at an open transaction (-1: read_uncommitted, None: not known)
        stable = self._consumer.last_stable_offset(partition)
        if stable is not None and stable >= 0:
            return int(stable)
        high = self._consumer.highwater(partition)
        return None if high is None else int(high)

    def position(self, tp: TP) -> int | None:
        # ``AIOKafkaConsumer.position`` waits for a position being reset; this never waits
        partition = TopicPartition(*tp)
        subscription = self._consumer._subscription
        if not subscription.is_assigned(partition):
            return None
        state = subscription.subscription.assignment.state_value(partition)
        return int(state.position) if state.has_valid_position else None

    def known_partitions(self, topics: Iterable[str]) -> dict[str, int]:
        known = {t: self._consumer.partitions_for_topic(t) for t in topics}
        return {t: len(parts) for t, parts in known.items() if parts is not None}

    async def fetch_partitions(self, topics: Iterable[str]) -> dict[str, int] | None:
        # what ``AIOKafkaConsumer.topics()`` fetches, keeping the partition counts (it keeps
        # only the names): aiokafka has no public call for a fresh snapshot of the cluster
        cluster = await self._consumer._client.fetch_all_metadata()
        known = {t: cluster.partitions_for_topic(t) for t in topics}
        return {t: len(parts) for t, parts in known.items() if parts is not None}

    def refresh_metadata(self) -> None:
        self._consumer._client.force_metadata_update()  # a shielded future: runs on its own


class MetadataThrottle:
    """An aiokafka client's ``force_metadata_update``, at most once per ``backoff_s``.

    While a partition it holds records for has no known leader (its topic was deleted),
    aiokafka's sender asks for fresh metadata every time round its loop, and the loop
    comes round as soon as the answer is in: a deleted verdict topic took 17-20 CPU
    seconds in 30 s and 1,500-3,000 ``Topic ... not found in cluster metadata`` lines a
    second, for as long as the records waited (``request_timeout_ms``). A call while a
    refresh is under way shares it, as in aiokafka; one within ``backoff_s`` of the last
    refresh gets the next one, due ``backoff_s`` after it.
    """

    def __init__(
        self,
        client: AIOKafkaClient,
        backoff_s: float = METADATA_REFRESH_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._force: Callable[[], asyncio.Future[Any]] = client.force_metadata_update
        self._backoff_s = backoff_s
        self._clock = clock
        self._last = -math.inf
        self._next: asyncio.Future[Any] | None = None
        self.refreshes = 0  # refreshes asked of the client (the tests read it)
        self.deferred = 0  # calls that waited for the next refresh instead

    @classmethod
    def install(cls, client: AIOKafkaClient, backoff_s: float = METADATA_REFRESH_BACKOFF_S) -> None:
        """Throttle ``client``'s refreshes for everyone who calls them (its sender too)."""
        client.force_metadata_update = cls(client, backoff_s)

    def __call__(self) -> asyncio.Future[Any]:
        if getattr(self._client, "_md_update_fut", None) is not None:
            return self._force()  # one is under way: no new request, its answer for all
        if self._next is not None and not self._next.done():
            self.deferred += 1
            return asyncio.shield(self._next)
        wait_s = self._last + self._backoff_s - self._clock()
        if wait_s <= 0:
            return self._refresh()
        self.deferred += 1
        loop = asyncio.get_running_loop()
        self._next = loop.create_future()
        loop.call_later(wait_s, self._fire, self._next)
        return asyncio.shield(self._next)

    def _refresh(self) -> asyncio.Future[Any]:
        self._last = self._clock()
        self.refreshes += 1
        return self._force()

    def _fire(self, waiting: asyncio.Future[Any]) -> None:
        # a plain future, not a task: a producer stopped meanwhile leaves nothing pending
        self._refresh().add_done_callback(lambda done: _settle(waiting, done))


def _settle(waiting: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    if waiting.done():
        return
    if done.cancelled() or done.exception() is not None:
        waiting.set_result(False)  # the caller asks again, as after any failed refresh
    else:
        waiting.set_result(done.result())


def producer_size_args(kafka: KafkaSettings, max_request_size: int) -> dict[str, int]:
    """An aiokafka producer's request limit and per-partition batch (at most one request)."""
    return {
        "max_request_size": max_request_size,
        "max_batch_size": min(kafka.producer_batch_bytes, max_request_size),
    }


class AiokafkaProducerPort:
    """An idempotent producer of the service's own (header values as bytes)."""

    def __init__(self, kafka: KafkaSettings, max_request_size: int) -> None:
        self._kafka = kafka
        self._sizes = producer_size_args(kafka, max_request_size)
        self._producer = self._new()
        self._retired: set[asyncio.Task[None]] = set()
        # ``send`` calls under way per producer: a retired one is stopped once they are
        # through (one waiting for a topic's metadata on a stopped producer waited forever)
        self._sending: dict[AIOKafkaProducer, int] = {}
        self._sent = asyncio.Event()  # a producer's last send under way returned

    def _new(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            **aiokafka_client_args(self._kafka),
            client_id=self._kafka.client_id,
            acks="all",
            enable_idempotence=True,
            **self._sizes,
        )
        MetadataThrottle.install(producer.client)
        return producer

    async def limit_batches(self, max_bytes: int) -> None:
        if max_bytes < self._sizes["max_batch_size"]:
            self._sizes["max_batch_size"] = max_bytes
            unstarted, self._producer = self._producer, self._new()
            await unstarted.stop()  # closes what its constructor opened

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)
        await self._producer.stop()

    async def reset(self, max_batch_bytes: int | None = None) -> None:
        if max_batch_bytes is not None:
            self._sizes["max_batch_size"] = min(self._sizes["max_batch_size"], max_batch_bytes)
        fresh = self._new()
        try:
            await fresh.start()
        except BaseException:
            await fresh.stop()
            raise  # the old producer stays: the caller tries again on the next failure
        old, self._producer = self._producer, fresh
        # the old one flushes in the background: its records on the broken partition fail
        # their confirmations and are sent again through the new one
        retiring = asyncio.create_task(self._retire(old), name="retire-producer")
        self._retired.add(retiring)
        retiring.add_done_callback(self._retired.discard)

    async def _retire(self, old: AIOKafkaProducer) -> None:
        """Stop ``old`` once the records handed to it meanwhile are in its buffer.

        A ``send`` first waits for its topic's metadata (up to ``request_timeout_ms``), and
        aiokafka leaves that wait pending for good once the producer stops: a send through
        the old producer that was waiting when the ticker replaced it (an operator raised
        a topic's limit) never returned, the processor task kept its lock, and the
        sidecar's stop waited on that lock for ever."""
        while old in self._sending:
            self._sent.clear()
            await self._sent.wait()
        await old.stop()

    async def send(
        self, topic: str, value: bytes, key: bytes | None, headers: Headers
    ) -> Awaitable[Any]:
        producer = self._producer
        self._sending[producer] = self._sending.get(producer, 0) + 1
        try:
            confirmation: Awaitable[Any] = await producer.send(
                topic, value, key=key, headers=list(headers)
            )
        finally:
            if self._sending[producer] > 1:
                self._sending[producer] -= 1
            else:
                del self._sending[producer]
                self._sent.set()
        return confirmation

    async def topic_limits(self, topics: Iterable[str]) -> dict[str, int]:
        names = set(topics)
        admin = AIOKafkaAdminClient(**aiokafka_client_args(self._kafka))
        try:
            await admin.start()
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in names]
            )
        except KafkaError as exc:
            log.warning("cannot read the output topics' max.message.bytes (%s)", exc)
            return {}
        finally:
            await admin.close()
        limits: dict[str, int] = {}
        for response in responses:
            for resource in response.resources:
                error_code, _message, _type, topic, entries = resource[:5]
                if error_code != 0 or topic not in names:
                    continue
                for entry in entries:
                    if entry[0] == "max.message.bytes" and str(entry[1]).isdigit():
                        limits[topic] = int(entry[1])
        return limits


def aiokafka_clients(
    consumer: AIOKafkaConsumer | None, kafka: KafkaSettings, max_request_size: int
) -> KafkaClients:
    """The real clients, once FastStream has built the subscriber's consumer."""
    if consumer is None:
        raise BrokerError("the subscriber has no consumer: start the broker first")
    return KafkaClients(
        AiokafkaConsumerPort(consumer), AiokafkaProducerPort(kafka, max_request_size)
    )


# --------------------------------------------------------------------------- in memory


@dataclass
class MemoryConsumerPort:
    """FastStream's in-memory broker calls the handler directly: nothing to fetch or pause.

    Pauses, resumes and commits are recorded (tests read them); there is no
    backlog and no cluster metadata.
    """

    assigned: set[TP] = field(default_factory=set)
    paused: set[TP] = field(default_factory=set)
    committed: dict[TP, int] = field(default_factory=dict)
    metadata: dict[TP, str] = field(default_factory=dict)

    def assignment(self) -> set[TP]:
        return set(self.assigned)

    def pause(self, partitions: Iterable[TP]) -> None:
        self.paused.update(partitions)

    def resume(self, partitions: Iterable[TP]) -> None:
        self.paused.difference_update(partitions)

    async def commit(
        self, offsets: Mapping[TP, int], metadata: Mapping[TP, str] | None = None
    ) -> None:
        self.committed.update(offsets)
        self.metadata.update({tp: (metadata or {}).get(tp, "") for tp in offsets})

    async def committed_metadata(self, partitions: Iterable[TP]) -> dict[TP, tuple[int, str]]:
        return {
            tp: (self.committed[tp], self.metadata.get(tp, ""))
            for tp in partitions
            if tp in self.committed
        }

    def highwater(self, tp: TP) -> int | None:
        del tp
        return None

    def position(self, tp: TP) -> int | None:
        del tp
        return None

    def known_partitions(self, topics: Iterable[str]) -> dict[str, int]:
        del topics
        return {}

    async def fetch_partitions(self, topics: Iterable[str]) -> dict[str, int] | None:
        del topics
        return None

    def refresh_metadata(self) -> None:
        return None


class MemoryProducerPort:
    """Publishes through FastStream's (in-memory) broker; header values decoded as text."""

    def __init__(self, broker: KafkaBroker) -> None:
        self._broker = broker

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(
        self, topic: str, value: bytes, key: bytes | None, headers: Headers
    ) -> Awaitable[Any]:
        text = {name: value.decode("utf-8", errors="replace") for name, value in headers}
        result = await self._broker.publish(
            value, topic=topic, key=key, headers=text, no_confirm=True
        )
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(result)
        return done

    async def topic_limits(self, topics: Iterable[str]) -> dict[str, int]:
        del topics
        return {}

    async def limit_batches(self, max_bytes: int) -> None:
        del max_bytes  # one record per publish: no batches

    async def reset(self, max_batch_bytes: int | None = None) -> None:
        del max_batch_bytes


def memory_clients(broker: KafkaBroker) -> KafkaClients:
    return KafkaClients(MemoryConsumerPort(), MemoryProducerPort(broker))
