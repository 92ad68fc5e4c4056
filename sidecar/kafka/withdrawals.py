"""The fleet's allow-certificate withdrawals: ``rag.certificates``, read into the policy.

A replica re-tests an allow certificate on the labels of its own partitions and
forgot them when it restarted: one replica's withdrawal was not another's, and a
restart applied a withdrawn certificate again. A withdrawal found here is published
(keyed by its calibration key, on a compacted topic: the processor's ticks); this
board reads the topic from its start before the sidecar consumes anything, then
follows it, and hands every record to the policy's
:class:`~sidecar.pipeline.ports.CertificateLedger`. A tombstone reinstates
(``guardrail certificates reinstate KEY``).

Records for keys this replica does not certify are ignored, and a record that is not
a withdrawal (bad JSON, another key inside than the record's key) is logged and
ignored: one line per interval for all of them (a producer's 1,000 junk records under
a certified key wrote 1,000 lines, 171 KB), the first in full. Tombstones are each
logged. A withdrawal only takes an allow away; a tombstone gives a withdrawn one
back, so who may write the topic is for the broker's ACLs to say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from guardrail_client.aio import cancel_and_wait
from sidecar.config import Settings
from sidecar.contracts.events import CertificateWithdrawal
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.permissions import authorisation_error, read_refused
from sidecar.kafka.security import aiokafka_client_args
from sidecar.kafka.topics import refusals_said
from sidecar.lograte import PER_INPUT
from sidecar.pipeline.ports import CertificateLedger

__all__ = ["CertificateBoard", "read_withdrawals", "reinstate"]

log = logging.getLogger("sidecar.kafka.certificates")

_FOLLOW_BACKOFF_S = 1.0


class CertificateBoard:
    """``rag.certificates`` into ``ledger``: all of it at :meth:`start`, then as it comes."""

    def __init__(
        self,
        settings: Settings,
        ledger: CertificateLedger,
        *,
        every_key: bool = False,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """``every_key``: hand every key to ``ledger``, not only those it certifies.
        ``on_refused``: told why when the cluster refuses the follower (its ACL removed):
        the fleet's withdrawals would go unseen, and a withdrawn allow served, for as long
        as the refusal lasts (the service makes it fatal)."""
        self._on_refused = on_refused
        self.topic = settings.topics.certificates
        self._kafka = settings.kafka
        self._ledger = ledger
        self._every_key = every_key
        self._consumer: AIOKafkaConsumer[bytes, bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self.applied = 0  # records handed to the ledger: withdrawals and tombstones
        self.tombstones = 0
        self.ignored = 0

    def _new_consumer(self, fetch_max_wait_ms: int) -> AIOKafkaConsumer[bytes, bytes]:
        return AIOKafkaConsumer(
            **aiokafka_client_args(self._kafka),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="guardrail-certificates",
            fetch_max_wait_ms=fetch_max_wait_ms,
        )

    async def start(self) -> None:
        """Read the topic to its end (before the sidecar decides anything), then follow it.

        ``BrokerError`` when it cannot be read within the request timeout. The catch-up
        consumer asks the broker to hold an empty fetch 10 ms (a held fetch delays the
        offset requests behind it on the connection: 500 ms at start on an empty topic);
        the follower, idle almost always, 500 ms."""
        timeout_s = self._kafka.request_timeout_ms / 1000.0
        catch_up = self._new_consumer(fetch_max_wait_ms=10)
        try:
            with refusals_said(self._kafka):
                async with asyncio.timeout(timeout_s):
                    positions = await self.read_to_end(catch_up)
            if len(positions) != 1:  # a key's records must stay on one partition
                raise ConfigError(
                    f"{self.topic} (GUARDRAIL_TOPICS__CERTIFICATES) has {len(positions)} "
                    "partitions; it must have exactly 1: with more, partitions added later "
                    "move a key, and its tombstone (guardrail certificates reinstate) no "
                    "longer lands beside its withdrawal. Create it with 1 partition, "
                    "cleanup.policy=compact (guardrail topics create does), and copy its "
                    "records over (guardrail certificates list)"
                )
            follower = self._consumer = self._new_consumer(fetch_max_wait_ms=500)
            await follower.start()
            follower.assign(list(positions))
            for tp, position in positions.items():
                follower.seek(tp, position)
        except (KafkaError, OSError, TimeoutError) as exc:
            await self.stop()
            raise BrokerError(
                f"cannot read {self.topic} (GUARDRAIL_TOPICS__CERTIFICATES, the fleet's "
                f"certificate withdrawals) within {timeout_s:g} s: {exc or type(exc).__name__}"
            ) from None
        finally:
            with contextlib.suppress(KafkaError, OSError):
                await catch_up.stop()
        self._task = asyncio.create_task(self._follow(follower), name="sidecar-certificates")

    async def read_to_end(
        self, consumer: AIOKafkaConsumer[bytes, bytes]
    ) -> dict[TopicPartition, int]:
        """Start ``consumer`` on every partition of the topic and apply what it holds now;
        returns where it stopped, per partition."""
        await consumer.start()
        if self.topic not in await consumer.topics():  # else: waits out the timeout unsaid
            raise ConfigError(
                f"topic {self.topic} (GUARDRAIL_TOPICS__CERTIFICATES) does not exist on "
                f"{self._kafka.bootstrap_servers}; create it first (`guardrail topics create`)"
            )
        consumer.subscribe([self.topic])  # no group: every partition, from the start
        # metadata first (a topic just created included); without a group aiokafka has no
        # event for the assignment
        while not consumer.assignment():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        tps = sorted(consumer.assignment())
        end = await consumer.end_offsets(tps)
        behind = [tp for tp in tps if await consumer.position(tp) < end[tp]]
        while behind:
            batch = await consumer.getmany(*tps, timeout_ms=500)
            for records in batch.values():
                for record in records:
                    self.apply(record)
            behind = [tp for tp in behind if await consumer.position(tp) < end[tp]]
        if self.applied:
            log.info(
                "%d record(s) of certified keys read from %s (%d withdrawal(s), %d tombstone(s))",
                self.applied, self.topic, self.applied - self.tombstones, self.tombstones,
            )  # fmt: skip
        return {tp: await consumer.position(tp) for tp in tps}

    async def _follow(self, consumer: AIOKafkaConsumer[bytes, bytes]) -> None:
        while True:
            try:
                batch = await consumer.getmany(timeout_ms=1000)
            except KafkaError as exc:
                log.warning("reading %s failed (%s); retrying", self.topic, exc)
                if (why := authorisation_error(exc)) is not None and self._on_refused:
                    self._on_refused(why)
                await asyncio.sleep(_FOLLOW_BACKOFF_S)
                continue
            for records in batch.values():
                for record in records:
                    try:
                        self.apply(record)
                    except Exception:  # a bug of ours must not stop the following
                        log.exception("%s@%d could not be applied", self.topic, record.offset)

    def apply(self, record: ConsumerRecord[bytes, bytes]) -> None:
        """One record: a withdrawal or a tombstone for a key certified here, else ignored.

        Junk under a key whose withdrawal the ledger holds is ignored *and* reported
        (``displaced``): once the topic is compacted the junk would be all that is left
        of the key, so the ledger publishes its withdrawal again."""
        key = _key(record.key)
        if key is None:
            self.ignored += 1
            log.warning(
                "%s[%d]@%d has no key, or one that is not UTF-8: ignored",
                record.topic, record.partition, record.offset, extra=PER_INPUT,
            )  # fmt: skip
            return
        if not (self._every_key or key in self._ledger.keys()):
            return
        if record.value is None:
            self._ledger.apply(key, None)
            self.applied += 1
            self.tombstones += 1
            log.warning(
                "tombstone of %s read from %s: a withdrawal of its certified allow, if "
                "any, is lifted (and its re-test window started afresh)", key, self.topic,
            )  # fmt: skip
            return
        try:
            withdrawal = CertificateWithdrawal.model_validate_json(record.value)
        except ValidationError as exc:
            self.ignored += 1
            self._ledger.displaced(key)
            log.warning(
                "%s[%d]@%d is not a certificate withdrawal, ignored: %s",
                record.topic, record.partition, record.offset, str(exc).splitlines()[0][:200],
                extra=PER_INPUT,
            )  # fmt: skip
            return
        if withdrawal.calibration_key != key:
            self.ignored += 1
            self._ledger.displaced(key)
            log.warning(
                "%s[%d]@%d names %s under the key %s, ignored",
                record.topic, record.partition, record.offset, withdrawal.calibration_key, key,
                extra=PER_INPUT,
            )  # fmt: skip
            return
        self._ledger.apply(key, withdrawal)
        self.applied += 1

    async def stop(self) -> None:
        if self._task is not None:
            error = await cancel_and_wait(self._task)
            if error is not None:
                log.error("the certificate withdrawals' reader ended", exc_info=error)
            self._task = None
        if self._consumer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await self._consumer.stop()
            self._consumer = None


def _key(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


class _Latest:
    """The latest record of every key (a ledger for ``guardrail certificates list``)."""

    def __init__(self) -> None:
        self.latest: dict[str, CertificateWithdrawal | None] = {}

    def keys(self) -> list[str]:
        return list(self.latest)

    def apply(self, key: str, withdrawal: CertificateWithdrawal | None) -> None:
        self.latest[key] = withdrawal

    def displaced(self, key: str) -> None:
        del key  # list shows the latest withdrawal or tombstone; junk is in the log

    def take_withdrawals(self, *, unconfirmed: bool = False) -> list[CertificateWithdrawal]:
        return []


async def read_withdrawals(settings: Settings) -> dict[str, CertificateWithdrawal | None]:
    """The latest record of every key of ``rag.certificates`` (``None``: reinstated), for
    ``guardrail certificates list``; records that are not withdrawals are left out."""
    ledger = _Latest()
    board = CertificateBoard(settings, ledger, every_key=True)
    consumer = board._new_consumer(fetch_max_wait_ms=10)
    timeout_s = settings.kafka.request_timeout_ms / 1000.0
    try:
        with refusals_said(settings.kafka):
            async with asyncio.timeout(timeout_s):
                await board.read_to_end(consumer)
    except (KafkaError, OSError, TimeoutError) as exc:
        took = f" within {timeout_s:g} s" if isinstance(exc, TimeoutError) else ""
        raise BrokerError(
            f"cannot read {settings.topics.certificates} (GUARDRAIL_TOPICS__CERTIFICATES) at "
            f"{settings.kafka.bootstrap_servers}{took} (GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS, "
            f"__REQUEST_TIMEOUT_MS): {exc or type(exc).__name__}{read_refused(settings, exc)}"
        ) from None
    finally:
        with contextlib.suppress(KafkaError, OSError):
            await consumer.stop()
    return ledger.latest


async def reinstate(settings: Settings, key: str) -> None:
    """Write the tombstone of ``key``: every replica gives it its certified allow back."""
    producer = AIOKafkaProducer(**aiokafka_client_args(settings.kafka), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(settings.topics.certificates, None, key=key.encode("utf-8"))
    finally:
        await producer.stop()
