"""``VerdictClient``: wait for a request's verdict, or iterate over its claims, in a replica.

Design (one per service replica): one consumer reads every partition of the
verdict topic (and the claims topic), with no consumer group, from the end
offsets it found at ``start()``; an in-memory waiter map (``waiters.py``)
wakes the caller awaiting that request id. Why not a consumer group: a group
gives each replica only some partitions, but a replica's requests hash onto
all of them, and a rebalance would move a partition away under its waiting
callers. Why not a reply-to topic per replica: the sidecar would have to
publish each verdict twice. The cost of this design is that every replica
reads every verdict's bytes (R replicas read R times the verdict traffic);
records nobody in the replica waits for are not decoded (a dict lookup each).
``bench/verdict_client.py`` measures the wait overhead with three replicas.

Fail-open / fail-closed: ``on_timeout`` decides what ``verdict()`` returns
when no final verdict came within the timeout (the sidecar is down or
lagging, the events never reached Kafka) — ``allow`` (fail open, the
default), ``block`` (fail closed) or ``raise`` (``VerdictTimeoutError``). The
same applies at once, without waiting, when this client's own consumer is
not running (``source="unavailable"``). A ``VerdictResult`` always says
whether the decision is the sidecar's (``source="sidecar"``) or the fallback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from guardrail_client.aio import cancel_and_wait
from guardrail_client.arguments import checked_options, checked_request_id, checked_timeout
from guardrail_client.authorised import READ, topic_operations
from guardrail_client.exceptions import (
    ClientAlreadyStartedError,
    ClientBrokerError,
    ClientNotStartedError,
    InvalidArgumentError,
    VerdictTimeoutError,
    require_authorised,
)
from guardrail_client.records import install_lenient_header_names
from guardrail_client.waiters import (
    EXPECTED_MAX_ENTRIES,
    RECENT_MAX_BYTES,
    Arrival,
    ClientStopped,
    Received,
    Stopped,
    WaiterMap,
)
from sidecar.contracts.events import AnswerVerdict, ClaimVerdict, Decision

log = logging.getLogger("guardrail_client")

OnTimeout = Literal["allow", "block", "raise"]
Source = Literal["sidecar", "timeout", "unavailable"]
_FALLBACK: dict[str, Decision] = {"allow": Decision.ALLOW, "block": Decision.BLOCK}


@dataclass(frozen=True, slots=True)
class VerdictResult:
    """What to do with an answer: the sidecar's verdict, or the stated fallback.

    ``source`` is ``sidecar`` when ``verdict`` holds the sidecar's decision;
    ``timeout`` / ``unavailable`` when ``decision`` is ``on_timeout``'s fallback
    and ``verdict`` is None. ``timestamp_ms`` is the verdict record's Kafka
    timestamp; ``woke_at_ms`` when the waiting caller resumed (wall clock).
    """

    request_id: str
    decision: Decision
    source: Source
    verdict: AnswerVerdict | None
    waited_s: float
    timestamp_ms: int | None = None
    woke_at_ms: float | None = None

    @property
    def from_sidecar(self) -> bool:
        return self.source == "sidecar"


class VerdictClient:
    """Verdicts and claim verdicts for this replica's requests (``async with VerdictClient(...)``).

    ``consumer_options`` go to ``AIOKafkaConsumer`` (security settings). Start
    it before publishing the requests it will wait for: it reads from the end
    offsets of the moment it started. ``claims_topic=None`` reads no claims.

    Records that come before anyone here waits for them are kept a while (a verdict can
    beat its caller): at most ``recent_max_entries`` request ids per topic, for
    ``recent_ttl_s``, and ``recent_max_bytes`` in all (both topics, the oldest forgotten
    first), so a flood of other replicas' verdicts and claims costs bounded memory. The
    client reads every replica's verdicts, so on a busy fleet that cache turns over in
    seconds: :meth:`expect` a request before publishing it and its records are kept
    apart (``expected_max_entries`` requests, ``recent_ttl_s`` from the announcement,
    ``recent_max_bytes`` of their own) until :meth:`verdict` or :meth:`claims` reads them.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        verdicts_topic: str = "rag.verdicts",
        claims_topic: str | None = "rag.claims",
        on_timeout: OnTimeout = "allow",
        timeout_s: float = 5.0,
        claims_settle_s: float = 0.5,
        recent_max_entries: int = 10_000,
        recent_ttl_s: float = 60.0,
        start_timeout_s: float = 30.0,
        recent_max_bytes: int = RECENT_MAX_BYTES,
        expected_max_entries: int = EXPECTED_MAX_ENTRIES,
        **consumer_options: Any,
    ) -> None:
        checked_options(VerdictClient, AIOKafkaConsumer, consumer_options)
        if on_timeout not in ("allow", "block", "raise"):
            raise InvalidArgumentError(
                f"on_timeout must be 'allow', 'block' or 'raise', got {on_timeout!r}"
            )
        self.on_timeout: OnTimeout = on_timeout
        self.timeout_s = checked_timeout("timeout_s", timeout_s, allow_zero=False)
        self.claims_settle_s = checked_timeout("claims_settle_s", claims_settle_s)
        self.start_timeout_s = checked_timeout("start_timeout_s", start_timeout_s, allow_zero=False)
        self.verdicts_topic = verdicts_topic
        self.claims_topic = claims_topic
        self.waiters = WaiterMap(
            recent_max_entries=recent_max_entries,
            recent_ttl_s=recent_ttl_s,
            recent_max_bytes=recent_max_bytes,
            expected_max_entries=expected_max_entries,
        )
        self._consumer_args: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "group_id": None,
            "enable_auto_commit": False,
            # start() pins every partition it finds to its end; a partition assigned later (one
            # added to the topic, or the topic deleted and created again) is read from its start:
            # with "latest", verdicts written before the assignment were lost for good
            "auto_offset_reset": "earliest",
            # how soon a new partition or a re-created topic is noticed (aiokafka: 5 minutes,
            # all callers falling back meanwhile)
            "metadata_max_age_ms": 10_000,
            "fetch_max_wait_ms": 100,
            **consumer_options,
        }
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = False  # from the start of start() to the end of stop()
        self.records_read = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Read every partition of the topics, from their current ends.

        ``ClientAlreadyStartedError`` when it is started already (or starting): a second
        consumer is never created; ``stop()`` first.
        """
        if self._started:
            raise ClientAlreadyStartedError(
                "VerdictClient.start() called again while it is started; call stop() first"
            )
        self._started = True
        try:
            await self._start_consumer()
        except BaseException:
            self._started = False
            raise

    async def _start_consumer(self) -> None:
        # a header name that is not UTF-8 (any producer's, any key) would otherwise raise out of
        # every getmany() and end the consumer task: every caller falling back from then on
        install_lenient_header_names()
        consumer = AIOKafkaConsumer(**self._consumer_args)
        try:
            await consumer.start()
            topics = [t for t in (self.verdicts_topic, self.claims_topic) if t]
            require_authorised(  # the topics exist, and the cluster's ACLs let it read them
                dict.fromkeys(topics, READ),
                await consumer.topics(),
                await topic_operations(consumer._client, topics),
                self._consumer_args,
            )
            # no group: subscribing assigns every partition (and any added later)
            consumer.subscribe(topics)
            async with asyncio.timeout(self.start_timeout_s):
                # aiokafka signals the assignment through no public event: poll for it
                while {tp.topic for tp in consumer.assignment()} != set(topics):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assigned = consumer.assignment()
            await consumer.seek_to_end(*assigned)  # the ends of now: no later record is missed
            for tp in assigned:
                await consumer.position(tp)
        except KafkaError as exc:
            await consumer.stop()
            raise ClientBrokerError(
                f"verdict consumer could not start at {self._consumer_args['bootstrap_servers']}: "
                f"{exc}"
            ) from exc
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._task = asyncio.create_task(self._consume(), name="guardrail-verdicts")

    async def stop(self) -> None:
        """Stop consuming; callers still waiting get their ``unavailable`` fallback at once."""
        self.waiters.close()
        try:
            if self._task is not None:
                await cancel_and_wait(self._task)  # its own errors are logged where it ends
        finally:  # the consumer is closed and start() possible again, whatever the task ended with
            try:
                if self._consumer is not None:
                    await _stopped(self._consumer.stop())
            finally:
                self._consumer = self._task = None
                self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # ------------------------------------------------------------------ waiting

    def expect(self, request_id: str) -> None:
        """Announce that this replica will wait for ``request_id`` (call it before publishing
        the request's events): its verdicts and claims are kept until ``recent_ttl_s`` after
        now, whatever other replicas' traffic passes through the recent cache meanwhile (a
        caller that streams the answer first and asks for the verdict after finds it)."""
        self.waiters.expect(checked_request_id(request_id))

    # ``timeout`` is a deadline for a fallback decision, not a cancellation (ASYNC109)
    async def verdict(
        self,
        request_id: str,
        timeout: float | None = None,  # noqa: ASYNC109
        *,
        tenant: str | None = None,
    ) -> VerdictResult:
        """The request's final verdict, or ``on_timeout``'s fallback after ``timeout`` seconds.

        ``tenant``: the tenant this request was sent for. Pass it when the sidecar takes
        tenants from a header: request ids are then scoped by tenant, but verdicts are
        keyed by request id, so another tenant can provoke one under yours; a verdict
        naming another tenant is then ignored.

        ``timeout``: seconds, finite and ``>= 0`` (0 takes only a verdict already here);
        None means ``timeout_s``. Anything else raises ``InvalidArgumentError``.
        """
        checked_request_id(request_id)
        if timeout is not None:
            checked_timeout("timeout", timeout)
        started = time.monotonic()
        if not self.running:
            return self._fallback(request_id, "unavailable", 0.0)
        future = self.waiters.wait_verdict(request_id, tenant)
        try:
            # not ``asyncio.wait_for``: on 3.11 it drops a cancellation of the caller that
            # comes as the verdict does
            async with asyncio.timeout(timeout if timeout is not None else self.timeout_s):
                received = await asyncio.shield(future)
        except TimeoutError:
            return self._fallback(request_id, "timeout", time.monotonic() - started)
        except ClientStopped:  # stop() while waiting: answered now, not at the timeout
            return self._fallback(request_id, "unavailable", time.monotonic() - started)
        finally:
            self.waiters.forget_verdict(request_id, future)
        self.waiters.answered(request_id)
        return VerdictResult(
            request_id=request_id,
            decision=received.event.decision,
            source="sidecar",
            verdict=received.event,
            waited_s=time.monotonic() - started,
            timestamp_ms=received.timestamp_ms,
            woke_at_ms=time.time() * 1000.0,
        )

    async def claims(
        self,
        request_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 - as verdict()
        *,
        tenant: str | None = None,
    ) -> AsyncIterator[ClaimVerdict]:
        """The request's claim verdicts as they come; ends after its final verdict.

        After the final verdict it waits at most ``claims_settle_s`` for claims
        still in flight (the verdict counts them). At the deadline it ends, or
        raises ``VerdictTimeoutError`` when ``on_timeout="raise"``. ``timeout`` and
        ``tenant``: as for :meth:`verdict`.
        """
        checked_request_id(request_id)
        if timeout is not None:
            checked_timeout("timeout", timeout)
        if self.claims_topic is None:
            raise ClientNotStartedError("this VerdictClient reads no claims (claims_topic=None)")
        started = time.monotonic()
        if not self.running:
            self._fallback(request_id, "unavailable", 0.0)
            return
        deadline = started + (timeout if timeout is not None else self.timeout_s)
        queue = self.waiters.subscribe_claims(request_id, tenant)
        seen: set[str] = set()
        expected: int | None = None
        try:
            while expected is None or len(seen) < expected:
                left = deadline - time.monotonic()
                try:
                    async with asyncio.timeout(max(left, 0.0)):
                        item = await queue.get()
                except TimeoutError:
                    if expected is None:
                        self._fallback(request_id, "timeout", time.monotonic() - started)
                    return
                if isinstance(item, Stopped):  # stop(), or the consumer ended: not at the deadline
                    if expected is None:
                        self._fallback(request_id, "unavailable", time.monotonic() - started)
                    return
                event = item.event
                if isinstance(event, AnswerVerdict):
                    c = event.signals.claims
                    expected = c.n + len(c.superseded_claims)
                    deadline = min(deadline, time.monotonic() + self.claims_settle_s)
                elif event.idempotency_key not in seen:
                    seen.add(event.idempotency_key)
                    yield event
        finally:
            self.waiters.unsubscribe_claims(request_id, queue)

    def _fallback(self, request_id: str, source: Source, waited_s: float) -> VerdictResult:
        if self.on_timeout == "raise":
            raise VerdictTimeoutError(request_id, source, waited_s)
        return VerdictResult(
            request_id=request_id,
            decision=_FALLBACK[self.on_timeout],
            source=source,
            verdict=None,
            waited_s=waited_s,
        )

    # ------------------------------------------------------------------ the consumer task

    async def _consume(self) -> None:
        try:
            await self._consume_records()
        except Exception:
            # never silent, and never a hang: the callers waiting now get their fallback at once,
            # later ones at once too (``running`` is False) until stop() and start()
            log.exception(
                "verdict consumer stopped on an unexpected error: every verdict() now gets "
                "on_timeout's fallback (source='unavailable') until stop() and start()"
            )
            self.waiters.close()

    async def _consume_records(self) -> None:
        assert self._consumer is not None  # noqa: S101 - started
        consumer, waiters = self._consumer, self.waiters
        failing = 0  # fetches failed in a row
        while True:
            try:
                batch = await consumer.getmany(timeout_ms=200)
            except KafkaError as exc:  # aiokafka retries on its own; log and go on
                # the first of a run and every 120th (a minute): an error that lasts (Read on
                # the verdict topic removed) wrote two lines a second into the service's log
                if failing % 120 == 0:
                    log.warning(
                        "verdict consumer: %s (%d fetch(es) failed in a row)", exc, failing + 1
                    )
                failing += 1
                await asyncio.sleep(0.5)
                continue
            if failing:
                log.warning("verdict consumer: reading again after %d failed fetch(es)", failing)
                failing = 0
            for tp, records in batch.items():
                offer = (
                    waiters.offer_verdict
                    if tp.topic == self.verdicts_topic
                    else (waiters.offer_claim)
                )
                for r in records:
                    self.records_read += 1
                    if r.key is None or r.value is None:
                        continue
                    key = r.key.decode("utf-8", errors="replace")
                    offer(key, Arrival(r.value, r.timestamp))


async def _stopped(stopping: Coroutine[Any, Any, None]) -> None:
    """Await a Kafka client's ``stop()``; a ``CancelledError`` it raises itself (not one
    aimed at this task) is swallowed: aiokafka's fetcher cancels its fetch tasks and awaits
    them, which raised out of ``VerdictClient.stop()`` with the broker gone (audit)."""
    try:
        await stopping
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("the Kafka client raised CancelledError while it stopped; it is stopped")


__all__ = ["OnTimeout", "Received", "Source", "VerdictClient", "VerdictResult"]
