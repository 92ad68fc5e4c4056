"""Publishing a step's outputs: confirmed sends, retries by kind, dead letters for what cannot go.

Pipelined (``submit``), a consumed batch's outputs are handed to the producer
in order and their confirmations awaited in the background, at most
``in_flight`` batches at a time (``kafka.batches_in_flight``); a batch's inputs
are finished (and so committable) only once all its outputs are confirmed *and*
every batch before it has finished: a request's answer verdict finishes the
inputs its streamed claim verdicts came from, so it must not finish them while
one of those is still being retried (a crash would then never publish it). A
step whose outputs could not be handed over is retried, in order, before any
later step is handed over, so its claim verdicts still precede their answer
verdict.

Outputs go to the producer port with header values as bytes. Publish errors
are decided by kind (``classify``): retriable ones are retried with capped,
jittered backoff while ``LoopState.publishing`` turns false after
``publish_stall_s``; a record too large for its topic goes to the DLQ cut down
to fit (``fit_dead_letter``), never retried as it is; an authorisation or
configuration error makes the loop not live (``LoopState.fatal``), with one log
line naming the topic. A refusal that breaks the idempotent producer's
sequence numbers on a partition (a record the broker refused as too large, then
``OutOfOrderSequenceNumber`` for every later one) replaces the producer
(``ProducerPort.reset``) instead of stopping the loop.

Readiness also follows the oldest output not yet confirmed
(``LoopState.unconfirmed_since``): aiokafka retries a record itself for its
request timeout (30 s) before a failure reaches the loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)
from aiokafka.errors import RecordTooLargeError as KafkaRecordTooLargeError

from sidecar.exceptions import (
    BrokerAccessError,
    BrokerError,
    GuardrailError,
    InputError,
    RecordTooLargeError,
)
from sidecar.kafka.clients import ProducerPort
from sidecar.kafka.readiness import LoopState
from sidecar.lograte import PER_INPUT
from sidecar.pipeline.deadletters import (
    fit_dead_letter,
    record_size,
    reroute_refused_output,
    undeliverable_output,
)
from sidecar.pipeline.offsets import OffsetTracker
from sidecar.pipeline.outputs import INPUT_DESTINATIONS, Destination, Output, Step
from sidecar.telemetry import Telemetry

log = logging.getLogger("sidecar.kafka")

_Sent = tuple[Output, Any, Awaitable[Any]]  # an output handed over, its span, its confirmation
_Failed = tuple[Output, Any]  # an output to publish one by one, its open span (or None)

MAX_PUBLISH_BACKOFF_S = 5.0
FIRST_PUBLISH_BACKOFF_S = 0.1
REQUEST_SIZE_MARGIN_BYTES = 65_536  # the producer's max_request_size over max_message_bytes
MIN_DLQ_BYTES = 1_024  # a DLQ topic that refuses a dead letter this small is misconfigured
LIMITS_REFRESH_S = 30.0  # an output over a topic's limit: read the limits again, at most this often

_TOO_LARGE = (MessageSizeTooLargeError, KafkaRecordTooLargeError)
_NO_ACCESS = (
    TopicAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    SaslAuthenticationFailed,
    AuthenticationFailedError,
    InvalidTopicError,
    ProducerFenced,
)
# aiokafka's idempotent producer does not recover from these on its own: after the broker
# refuses a batch as too large, every later batch to that partition is refused as out of
# order. A fresh producer (a new producer id) starts the sequence again.
_BREAKS_PRODUCER = (*_TOO_LARGE, OutOfOrderSequenceNumber)


def classify(exc: BaseException, topic: str) -> BrokerError:
    """A failed publish to ``topic`` as the kind the loop branches on (flags, not text).

    ``RecordTooLargeError`` (``dead_letter``): this record alone can never go out as
    it is. ``BrokerAccessError`` (``fatal``): authorisation or configuration, or a
    producer that cannot recover. Anything else is retriable (``BrokerError``):
    aiokafka's own ``retriable`` errors, timeouts, a broker that is away.
    """
    if isinstance(exc, BrokerError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, _TOO_LARGE):
        return RecordTooLargeError(topic, f"{name}: {exc}")
    if isinstance(exc, _NO_ACCESS):
        return BrokerAccessError(topic, f"{name}: {exc}")
    return BrokerError(f"publish to {topic} failed: {name}: {exc}")


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Seconds before retry ``attempt`` (0-based): capped exponential, jittered in [1/2, 1]."""
    ceiling = min(MAX_PUBLISH_BACKOFF_S, FIRST_PUBLISH_BACKOFF_S * 2.0 ** min(attempt, 32))
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


def request_size_bytes(max_message_bytes: int) -> int:
    """The producer's ``max_request_size``: one record of ``max_message_bytes`` and its batch."""
    return max_message_bytes + REQUEST_SIZE_MARGIN_BYTES


class Publisher:
    """Publishes steps through a producer port; finishes their inputs once confirmed."""

    def __init__(
        self,
        producer: ProducerPort,
        destinations: dict[Destination, str],
        *,
        max_message_bytes: int,
        state: LoopState,
        tracker: OffsetTracker,
        telemetry: Telemetry,
        stopping: asyncio.Event,
        pipelined: bool,
        in_flight: int = 4,
    ) -> None:
        """``in_flight``: steps whose confirmations may be awaited in the background
        (``submit``); 0 confirms each step before ``submit`` returns."""
        self.producer = producer
        self.destinations = destinations
        self.state = state
        self.tracker = tracker
        self.telemetry = telemetry
        self._stopping = stopping
        self._pipelined = pipelined
        # bytes one record may take per destination: the producer's request limit, the
        # DLQ topic's max.message.bytes; lowered to each topic's own setting at start
        request_limit = request_size_bytes(max_message_bytes)
        self._configured = {d: request_limit for d in Destination}
        self._configured[Destination.DLQ] = max_message_bytes
        self.limits = dict(self._configured)
        self._rng = random.Random()  # noqa: S311 - backoff jitter (instances out of step)
        self._in_flight: deque[asyncio.Task[bool]] = deque()
        self._max_in_flight = in_flight
        self._producer_generation = 0  # bumped by every producer reset
        self._reset_lock = asyncio.Lock()
        # an output over a limit read earlier: the limits are read again every
        # limits_refresh_s (on the loop's tick) until one was raised, so a topic's limit
        # raised by its operator counts without a restart, and without another output
        # lost to the dead-letter topic first (a withdrawal announced again fits then)
        self.limits_refresh_s = LIMITS_REFRESH_S
        self._over_limit = False
        self._limits_read_at = time.monotonic()
        self._limits_logged = False
        # steps with outputs not yet confirmed: when each was handed over (monotonic s)
        self._unconfirmed: dict[int, float] = {}
        self._steps = itertools.count()

    async def read_topic_limits(self) -> dict[str, int]:
        """Lower ``limits`` to each output topic's own ``max.message.bytes``; returns those
        the broker told (empty when it could not be asked)."""
        self._limits_read_at = time.monotonic()
        own = await self.producer.topic_limits(self.destinations.values())
        if not own:
            return {}
        before = dict(self.limits)
        for dest, topic in self.destinations.items():
            if topic in own:  # read again after a refusal: a limit raised since counts too
                self.limits[dest] = min(self._configured[dest], own[topic])
        if self.limits != before or not self._limits_logged:  # read every 30 s at times
            self._limits_logged = True
            shown = ", ".join(f"{d.value}={n}" for d, n in self.limits.items())
            log.info("record limits per output topic: %s", shown)
        return own

    async def refresh_limits(self) -> bool:
        """Read the topics' limits again, ``limits_refresh_s`` after the last read, while
        an output was over one and none has been raised since; True when it read them.
        An output over the sidecar's own limit (below the topic's) is no reason: raising
        the topic's could not let it through, and the limits were read every 30 s for good.

        Read once after each over-limit output, a limit raised after that read went
        unseen until another output was over it (and was dead-lettered for it): the
        operator's fix cost one more record, or never came into force for a topic that
        rarely sees one that large."""
        if not self._over_limit or time.monotonic() - self._limits_read_at < self.limits_refresh_s:
            return False
        before = dict(self.limits)
        own = await self.read_topic_limits()
        raised = {d.value: v for d, v in self.limits.items() if v > before[d]}
        if raised:
            self._over_limit = False
        if raised and own:
            log.warning("output topic limit(s) raised since they were read: %s", raised)
            async with self._reset_lock:  # its batches were capped by the smallest limit
                await self._replace_producer(min(own.values()))
        return True

    async def emit(self, step: Step, *, retry: bool = True) -> None:
        """Publish a step's outputs (retrying until confirmed), then finish its inputs.

        With ``retry=False`` (shutdown) a failed publish leaves the step's inputs
        unfinished, so they stay uncommitted and are read again. Pipelined (the
        default): every output is handed to the producer first and the
        confirmations are awaited together; what failed is retried one by one.
        An output too large for its topic is replaced by a dead letter that fits.
        """
        token = self._handing_over(step)
        try:
            outputs = [self._fitted(out) for out in step.outputs]
            generation = self._producer_generation
            if self._pipelined and len(outputs) > 1:
                sent, failed = await self._send_all(outputs)
            else:
                sent, failed = [], [(out, None) for out in outputs]
            before = self._in_flight[-1] if self._in_flight else None
            await self._finish(step, sent, failed, generation, retry=retry, after=before)
        finally:
            self._confirmed(token)

    async def submit(self, step: Step) -> None:
        """Hand a step's outputs to the producer and return; it is finished once confirmed.

        Pipelined, the confirmations are awaited in the background, so the next
        batch is worked on meanwhile; at most ``in_flight`` steps wait for
        theirs (the oldest is awaited first). Outputs go to the producer in the
        order of the steps. With ``in_flight`` 0, and for the baseline (not
        pipelined), this is ``emit``: confirmed before it returns.
        """
        if not self._pipelined or self._max_in_flight == 0:
            await self.emit(step)
            return
        self._reap()
        while len(self._in_flight) >= self._max_in_flight:
            await asyncio.wait({self._in_flight[0]})
            self._reap()
        generation = self._producer_generation
        token = self._handing_over(step)
        try:
            sent, failed = await self._send_all([self._fitted(out) for out in step.outputs])
        except BaseException:
            self._confirmed(token)
            raise
        before = self._in_flight[-1] if self._in_flight else None
        confirming = asyncio.create_task(
            self._finish(step, sent, failed, generation, retry=True, after=before)
        )
        confirming.add_done_callback(lambda _: self._confirmed(token))
        self._in_flight.append(confirming)
        if failed:  # retried before any later step goes out: the order of outputs holds
            await asyncio.wait({confirming})
            self._reap()

    def _handing_over(self, step: Step) -> int | None:
        """Start the clock of a step's outputs (readiness: ``LoopState.unconfirmed_since``)."""
        if not step.outputs:
            return None
        token = next(self._steps)
        self._unconfirmed[token] = time.monotonic()
        if self.state.unconfirmed_since is None:
            self.state.unconfirmed_since = self._unconfirmed[token]
        return token

    def _confirmed(self, token: int | None) -> None:
        """A step's outputs are confirmed (or given up on): the next oldest one's clock."""
        if token is None or self._unconfirmed.pop(token, None) is None:
            return
        self.state.unconfirmed_since = min(self._unconfirmed.values(), default=None)

    @property
    def in_flight(self) -> int:
        """Steps handed to the producer whose inputs are not finished yet."""
        self._reap()
        return len(self._in_flight)

    async def settle(self, timeout_s: float | None = None) -> bool:
        """Wait (at most ``timeout_s``) for the steps in flight; True when none is left."""
        waiting = set(self._in_flight)
        if waiting:
            await asyncio.wait(waiting, timeout=timeout_s)
        self._reap()
        return not self._in_flight

    def abandon(self) -> int:
        """Stop waiting for the steps in flight (at shutdown, after ``settle`` timed out):
        their inputs stay pending, so they are read again. Returns how many there were."""
        self._reap()
        pending = list(self._in_flight)
        for task in pending:
            task.cancel()
        return len(pending)

    def _reap(self) -> None:
        """Drop the steps whose confirmations are through; log one that failed unexpectedly."""
        while self._in_flight and self._in_flight[0].done():
            task = self._in_flight.popleft()
            if not task.cancelled() and (error := task.exception()) is not None:
                log.error("confirming a step failed; its inputs stay pending", exc_info=error)

    async def send_output(self, out: Output) -> Awaitable[Any]:
        """Hand one output to the producer; returns what confirms it (the tests' seam)."""
        topic = self.destinations[out.destination]
        return await self.producer.send(topic, out.value, out.key, out.headers)

    def _fitted(self, out: Output, limit: int | None = None, why: str = "") -> Output:
        """``out`` if it fits its destination, else a dead letter (cut down to fit the DLQ)."""
        topic = self.destinations[out.destination]
        size = record_size(out.key, out.value, out.headers)
        if out.destination is not Destination.DLQ:
            if size <= self.limits[out.destination]:
                return out
            # the topic's limit binds, not the sidecar's own: the operator can raise it
            self._over_limit |= self.limits[out.destination] < self._configured[out.destination]
            why = f"{size} bytes with headers exceed the {self.limits[out.destination]}-byte limit"
            out = self._undeliverable(out, RecordTooLargeError(topic, why))
            size = record_size(out.key, out.value, out.headers)
        dlq = self.destinations[Destination.DLQ]
        limit = min(limit or self.limits[Destination.DLQ], self.limits[Destination.DLQ])
        why = why or (
            f"{size} bytes with headers exceed the {limit}-byte limit of {dlq} (max.message.bytes)"
        )
        fitted = fit_dead_letter(out, limit, why)
        if fitted is not out:
            self.state.truncated_dead_letters += 1
            log.warning("dead letter for %s truncated: %s", dlq, why, extra=PER_INPUT)
        return fitted

    def _undeliverable(self, out: Output, error: RecordTooLargeError) -> Output:
        if out.destination in INPUT_DESTINATIONS:  # a rerouted record, with its key and header
            return self._reroute_refused(out, error)
        self.state.undeliverable_outputs += 1
        topic = self.destinations[out.destination]
        log.error(
            "an output for %s can never be published (%s); dead-lettered",
            topic,
            error,
            extra=PER_INPUT,
        )
        reason = InputError("output-too-large", str(error))
        return undeliverable_output(out, topic, reason, failed_at=datetime.now(UTC))

    def _reroute_refused(self, out: Output, error: BrokerError) -> Output:
        """The dead letter of a rerouted record its topic refuses (authorisation, or its
        size: the original's, with a key and the header, over the topic's limit)."""
        self.state.undeliverable_outputs += 1
        topic = self.destinations[out.destination]
        log.error("rerouting a record to %s was refused (%s); dead-lettered", topic, error,
                  extra=PER_INPUT)  # fmt: skip
        reason = InputError(
            "reroute-refused",
            f"{error}: a record off its request's murmur2 partition could not be sent on to "
            f"it; if refused access, give the sidecar's principal WRITE on {topic}, or set "
            "GUARDRAIL_JOIN__REROUTE=false (joined where read: with several replicas its "
            "request may be decided incomplete by two)",
        )
        return reroute_refused_output(out, reason, failed_at=datetime.now(UTC))

    async def _send_all(self, outputs: list[Output]) -> tuple[list[_Sent], list[_Failed]]:
        """Hand every output to the producer: what was sent, with its confirmation, and
        what failed already (with its open span)."""
        sent: list[_Sent] = []
        failed: list[_Failed] = []
        for out in outputs:
            span = self.telemetry.before_publish(out, self.destinations[out.destination])
            if failed:  # nothing overtakes an output to be retried: it goes after it, in order
                failed.append((out, span))
                continue
            try:
                confirmation = await self.send_output(out)
            except (KafkaError, TimeoutError) as exc:
                log.warning("handing an output for %s over failed (%r); retrying in order",
                            self.destinations[out.destination], exc)  # fmt: skip
                failed.append((out, span))
                continue
            sent.append((out, span, confirmation))
        return sent, failed

    async def _finish(
        self,
        step: Step,
        sent: list[_Sent],
        failed: list[_Failed],
        generation: int,
        *,
        retry: bool,
        after: asyncio.Task[bool] | None = None,
    ) -> bool:
        """Await the confirmations, retry what failed one by one (in the step's order),
        then finish the inputs once the step before (``after``) has finished its own.

        False when it gave up (stopping, ``retry=False``, or the step before gave up):
        the inputs stay pending and are read again.
        """
        results = await asyncio.gather(*(c for _, _, c in sent), return_exceptions=True)
        unconfirmed: list[_Failed] = []
        for (out, span, _), result in zip(sent, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, KafkaError | TimeoutError):
                    raise result
                topic = self.destinations[out.destination]
                log.warning("publish to %s not confirmed (%r); retrying", topic, result)
                if isinstance(result, _BREAKS_PRODUCER):
                    await self._reset_producer(generation, result, topic)
                unconfirmed.append((out, span))
            else:
                self.telemetry.after_publish(span, result, out)
        for out, span in unconfirmed + failed:  # sent ones came first in the step
            if not await self._publish_one(out, span, retry=retry):
                return False
        if step.done and after is not None and not await self._finished(after):
            return False
        for ref in step.done:
            self.tracker.done(ref.tp, ref.offset, ref.incarnation)
        return True

    @staticmethod
    async def _finished(step: asyncio.Task[bool]) -> bool:
        """Whether an earlier step finished its inputs (its failure is logged by ``_reap``)."""
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if step.cancelled() and not (current is not None and current.cancelling()):
                return False
            raise  # this step itself is being cancelled (as well)
        except Exception:  # noqa: BLE001 - the earlier step's own error, logged where it ended
            return False

    async def _reset_producer(self, generation: int, error: BaseException, topic: str) -> None:
        """Replace the producer after ``error`` broke its sequence on a partition of ``topic``
        (once per breakage: ``generation`` is the producer the failed send went through).

        A broker-side size refusal also means the topic's limit is not what was read at
        start: it is read again, so records over it are dead-lettered before sending, and
        the new producer's batches stay within the smallest limit.
        """
        async with self._reset_lock:
            if generation != self._producer_generation:
                return  # another task has replaced that producer already
            log.warning(
                "replacing the producer: %s on %s (%r) leaves its sequence broken",
                type(error).__name__, topic, error,
            )  # fmt: skip
            own = await self.read_topic_limits() if isinstance(error, _TOO_LARGE) else {}
            await self._replace_producer(min(own.values()) if own else None)

    async def _replace_producer(self, max_batch_bytes: int | None) -> None:
        """A fresh producer (under ``_reset_lock``); when that fails the old one stays and
        the next failure tries again."""
        try:
            await self.producer.reset(max_batch_bytes)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("replacing the producer failed (%r); the old one stays", exc)
            return
        self._producer_generation += 1
        self.state.producer_resets += 1
        self.telemetry.producer_resets.add(1)

    async def _publish_one(self, out: Output, span: Any, *, retry: bool) -> bool:
        """Publish and await confirmation; False when giving up (stopping, or ``retry=False``).

        Retriable errors: retried with capped, jittered backoff; ``state.publishing``
        turns false once they last ``publish_stall_s``. Too large: the output is
        replaced by a dead letter that fits (smaller each time the broker refuses
        one). Fatal (authorisation, configuration): logged once, ``state.live``
        false; the loop keeps retrying, backing off to 5 s, until it is restarted.
        """
        topic = self.destinations[out.destination]
        if span is None:
            span = self.telemetry.before_publish(out, topic)
        attempt = 0
        refused_as_is = False
        while True:
            # limits read again after a refusal may no longer hold it
            out = self._replaced(out, self._fitted(out))
            generation = self._producer_generation
            handed_over = False
            try:
                confirmation = await self.send_output(out)
                handed_over = True
                metadata = await confirmation
            except (KafkaError, TimeoutError, GuardrailError) as exc:
                broker_refused = handed_over and isinstance(exc, _TOO_LARGE)
                if broker_refused or isinstance(exc, OutOfOrderSequenceNumber):
                    await self._reset_producer(generation, exc, topic)
                if broker_refused and not refused_as_is and self._fits(out):
                    # refused in a batch with others, or under a limit read before it was
                    # lowered (the limits are read again now): once more, on its own
                    refused_as_is = True
                    continue
                error = classify(exc, topic)
                if error.fatal and out.destination in INPUT_DESTINATIONS:
                    # a rerouted record its topic refuses us (no WRITE on the inputs): that
                    # record to the DLQ, not the loop down for a producer's partitioner
                    out = self._replaced(out, self._fitted(self._reroute_refused(out, error)))
                    continue
                if error.dead_letter:
                    try:
                        out = self._replaced(out, self._smaller(out, error))
                    except BrokerAccessError as refused:
                        error = refused
                    else:
                        continue
                if not retry or self._stopping.is_set():
                    log.warning("stopping: %s stays uncommitted and will be re-read", topic)
                    return False
                self._failing(error, exc, topic)
                delay = backoff_delay(attempt, self._rng)
                attempt += 1
                self.state.publish_retries += 1
                self.telemetry.publish_retries.add(1)
                log.warning("publish to %s failed (%s); retrying in %.2fs", topic, error, delay)
                await asyncio.sleep(delay)
            else:
                self.state.publish_failing_since = None
                self.state.outputs_missing.pop(self.destinations[out.destination], None)
                self.telemetry.after_publish(span, metadata, out)
                return True

    def _replaced(self, old: Output, new: Output) -> Output:
        """``new`` in ``old``'s place; a dead letter replacing an output is counted here
        (``before_publish`` opened ``old``'s span, which stays open; ``after_publish``
        counts ``old`` only if it is what was published)."""
        if new.destination is Destination.DLQ and old.destination is not Destination.DLQ:
            self.telemetry.dead_lettered(new)
        return new

    def _fits(self, out: Output) -> bool:
        """An output (not a dead letter) within its topic's limit as now known."""
        if out.destination is Destination.DLQ:
            return False  # a refused dead letter is cut down (``_smaller``)
        return record_size(out.key, out.value, out.headers) <= self.limits[out.destination]

    def _smaller(self, out: Output, error: GuardrailError) -> Output:
        """After a too-large refusal: the dead letter to try instead (half the size, at most)."""
        size = record_size(out.key, out.value, out.headers)
        if out.destination is not Destination.DLQ:
            assert isinstance(error, RecordTooLargeError)  # noqa: S101 - dead_letter errors
            return self._fitted(self._undeliverable(out, error))
        if size // 2 < MIN_DLQ_BYTES:
            dlq = self.destinations[Destination.DLQ]
            raise BrokerAccessError(
                dlq, f"refuses a dead letter of {size} bytes; check its max.message.bytes"
            ) from error
        return self._fitted(out, size // 2, f"refused by the broker at {size} bytes: {error}")

    def _failing(self, error: BrokerError, exc: BaseException, topic: str) -> None:
        """Book a failed attempt: readiness after ``publish_stall_s``; liveness if fatal."""
        now = time.monotonic()
        if self.state.publish_failing_since is None:
            self.state.publish_failing_since = now
        if isinstance(exc, UnknownTopicOrPartitionError):  # after aiokafka's own wait for it
            self.state.output_missing(topic, now, since=self.state.publish_failing_since)
        if error.fatal:
            self.state.fail(str(error))
