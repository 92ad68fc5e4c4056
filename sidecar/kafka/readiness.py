"""Readiness and liveness of the loop: its state, the broker probe and the input-topic checks.

``LoopState`` is what ``/readyz``, ``/livez`` and the tests read. The probe
asks the cluster for fresh metadata every ``PROBE_INTERVAL_S`` on a clock of its
own (a commit that aiokafka retries through a network stall must not freeze
it): the broker is reachable, and the input topics exist with the partition
counts they had at start, and the output topics it has seen are still there. An
assignment that tears a partition number's inputs apart across members (a
member without the co-partitioning assignor) is reported the same way: one log
line, and not ready.

Publishing is judged by the age of the oldest output not yet confirmed, not by
the errors it returns: aiokafka retries a record itself for its request
timeout (30 s) before a failure shows (a deleted verdict topic: the first error
came 30 s late, and as ``NotLeaderForPartitionError``), and the loop's own
retries come after that. An output topic the probe no longer finds is missing
from then on, whatever the producer reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError

from sidecar.exceptions import BrokerAccessError
from sidecar.kafka.assignor import split_pairs
from sidecar.kafka.clients import TP, ConsumerPort
from sidecar.kafka.permissions import AUTHORISATION_ERRORS, authorisation_error
from sidecar.kafka.topics import format_counts, partition_count_problem
from sidecar.pipeline.progress import Progress

log = logging.getLogger("sidecar.kafka")

PUBLISH_STALL_S = 10.0  # publishing failing this long: not ready (the loop keeps retrying)
PROCESSING_STALL_S = 60.0  # a processor call without progress this long: not ready
PROCESSING_FATAL_S = 300.0  # ... this long: not live, the pod restarts (http.processing_*_s)
MISSING_TOPIC_FATAL_S = 30.0  # a destination topic missing this long: not live either
PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 2.0


@dataclass(slots=True)
class LoopState:
    """What the health endpoint and the tests read."""

    started: bool = False
    broker_ok: bool = False  # the last metadata probe (every ~2 s) reached the cluster
    assigned: set[tuple[str, int]] = field(default_factory=set)
    # the group gave this member its assignment at least once, possibly none: with more
    # members than partitions (a rolling update's surge pod) an idle member is ready
    group_joined: bool = False
    # what the last assignment tears apart (a partition number held on one input topic
    # but not on another), one line each; non-empty: not ready
    split: list[str] = field(default_factory=list)
    # the input topics exist with equal partition counts, as at start (the probe checks)
    topics_ok: bool = True
    input_partitions: dict[str, int] = field(default_factory=dict)  # as the last probe saw them
    commits: int = 0
    last_committed: dict[tuple[str, int], int] = field(default_factory=dict)
    publish_retries: int = 0
    truncated_dead_letters: int = 0
    undeliverable_outputs: int = 0  # outputs too large for their topic, dead-lettered instead
    producer_resets: int = 0  # producers replaced after a refusal broke their sequence numbers
    consumer_failures: int = 0  # consume tasks that ended in an exception (ConsumerWatch)
    consumer_failing: str | None = None  # why the consume task keeps failing: not live
    publish_failing_since: float | None = None  # monotonic s: the output being retried first failed
    # monotonic s: the oldest output handed to the producer (or about to be) and not yet
    # confirmed; the Publisher keeps it
    unconfirmed_since: float | None = None
    # output topics missing (monotonic s since): the probe found them gone, or the
    # producer said so; a topic seen again, or published to, is dropped
    outputs_missing: dict[str, float] = field(default_factory=dict)
    publish_stall_s: float = PUBLISH_STALL_S
    missing_topic_fatal_s: float = MISSING_TOPIC_FATAL_S
    fatal: str | None = None  # why no retry can help (authorisation, configuration)
    # monotonic s: the oldest call handed to the processor thread and not returned yet (a
    # batch, a tick, a revocation's drop); None while it is idle
    processing_since: float | None = None
    processing_stall_s: float = PROCESSING_STALL_S
    processing_fatal_s: float = PROCESSING_FATAL_S
    # the processor's beats (a record admitted, a request scored): a long batch with claims
    # keeps beating, a hung call does not
    progress: Progress | None = None

    def processing_for(self, now: float | None = None) -> float:
        """How long a call has held the processor thread without progress: since the later
        of its start and the processor's last beat (0 while idle)."""
        since = self.processing_since
        if since is None:
            return 0.0
        if self.progress is not None:
            since = max(since, self.progress.at)
        return (time.monotonic() if now is None else now) - since

    @property
    def processing(self) -> bool:
        """For readiness: false once a call has held the processor ``processing_stall_s``
        without progress (a hung native call, a judge request without a timeout): nothing
        is decided meanwhile, while the consumer, the probes and the lag all look fine
        (audit)."""
        return self.processing_for() < self.processing_stall_s

    @property
    def processor_wedged(self) -> bool:
        """For liveness: a call has held the processor ``processing_fatal_s`` without
        progress."""
        return self.processing_for() >= self.processing_fatal_s

    @property
    def publishing(self) -> bool:
        """For readiness: false once an output has waited ``publish_stall_s`` for its
        confirmation, publishing has failed that long, an output topic has been missing
        that long, or after a fatal error."""
        if self.fatal is not None:
            return False
        clocks = (
            self.publish_failing_since,
            self.unconfirmed_since,
            *self.outputs_missing.values(),
        )
        since = min((c for c in clocks if c is not None), default=None)
        return since is None or time.monotonic() - since < self.publish_stall_s

    def output_missing(self, topic: str, now: float, since: float | None = None) -> None:
        """``topic`` is missing, since ``since`` if it was not already (default ``now``):
        not live once that has lasted ``missing_topic_fatal_s``."""
        self.outputs_missing.setdefault(topic, now if since is None else since)
        self.check_missing(now)

    def check_missing(self, now: float | None = None) -> None:
        """Fatal once an output topic has been missing ``missing_topic_fatal_s``.

        Liveness calls it whenever it is read. Checked only where a topic is found
        missing (the probe: 2 s apart, plus its metadata round trip), the deadline
        passed unseen until the next probe: 15 s came as 16.6-17.1 s on a loaded CPU,
        30 s as 31 s.
        """
        now = time.monotonic() if now is None else now
        for topic, since in self.outputs_missing.items():
            if (persisted := now - since) >= self.missing_topic_fatal_s:
                error = BrokerAccessError(topic, f"the topic does not exist (for {persisted:.0f}s)")
                self.fail(str(error))
                return

    def fail(self, why: str) -> None:
        """A fatal error: not live (nor ready) until restarted; logged once."""
        if self.fatal is None:
            self.fatal = why
            log.error("FATAL %s; not live until restarted", why)

    def readiness_checks(self, requires_assignment: bool) -> dict[str, bool]:
        """What ``/readyz`` answers once the loop runs, and ``guardrail.ready`` reads
        (``requires_assignment``: ``http.ready_requires_assignment``)."""
        return {
            "broker_connected": self.broker_ok,
            "models_loaded": True,
            "inputs_co_partitioned": not self.split and self.topics_ok,
            "publishing": self.publishing,
            "processing": self.processing,
            **({"group_joined": self.group_joined} if requires_assignment else {}),
        }

    def liveness_checks(self) -> dict[str, bool]:
        """Each check the pod restarts for: a publish error retrying cannot fix; a consume
        task that keeps failing (``ConsumerWatch``); a processor call without progress
        past ``processing_fatal_s``. Reads only (``guardrail.live`` reads it at scrape
        time, off the loop): ``/livez`` first has :meth:`check_missing` judge an output
        topic missing too long, as the probe does every ``PROBE_INTERVAL_S``."""
        return {
            "no_fatal_publish_error": self.fatal is None,
            "consumer_not_failing": self.consumer_failing is None,
            "processor_not_wedged": not self.processor_wedged,
        }

    @property
    def live(self) -> bool:
        """For liveness: false after a fatal publish error (an output topic missing too
        long is one, judged as this is read), while the consume task keeps failing (a
        restart with the cause logged), or while the processor is wedged."""
        self.check_missing()
        return self.fatal is None and self.consumer_failing is None and not self.processor_wedged


CONSUMER_FAILURES_FATAL = 10  # consume tasks ending in an exception within the window
CONSUMER_FAILURE_WINDOW_S = 30.0


class ConsumerWatch:
    """The consume task's failures: FastStream restarts a consume task that raised.

    A record aiokafka cannot read (a header name that was not UTF-8 did this until
    ``sidecar.kafka.records``) raises out of every fetch: the task was restarted
    hundreds of times a second, nothing was read again, the dead tasks piled up in
    memory, and the loop looked ready. ``check`` (every tick) drops the dead tasks
    from the subscriber's list, counts them in ``LoopState.consumer_failures``, and
    ``CONSUMER_FAILURES_FATAL`` within ``CONSUMER_FAILURE_WINDOW_S`` make the loop
    not live, with one log line naming the error: a restart that shows, not a spin.
    """

    def __init__(self, state: LoopState, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self._clock = clock
        self._recent: deque[float] = deque()

    def check(self, tasks: list[asyncio.Task[Any]] | None) -> None:
        if not tasks:
            return
        dead = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        if not dead:
            return
        now = self._clock()
        for task in dead:
            tasks.remove(task)
            self._recent.append(now)
        self.state.consumer_failures += len(dead)
        while self._recent and now - self._recent[0] > CONSUMER_FAILURE_WINDOW_S:
            self._recent.popleft()
        error = dead[-1].exception()
        log.warning("the consume task failed %d time(s): %r", len(dead), error)
        if len(self._recent) >= CONSUMER_FAILURES_FATAL and self.state.consumer_failing is None:
            self.state.consumer_failing = (
                f"the consumer failed {len(self._recent)} times within "
                f"{CONSUMER_FAILURE_WINDOW_S:.0f}s: {error!r}"
            )
            log.error("FATAL %s; not live until restarted", self.state.consumer_failing)


def watch_authorisation(subscriber: Any, state: LoopState) -> None:
    """Make an authorisation error out of ``subscriber``'s fetches fatal (not live).

    FastStream's consume loop catches every ``KafkaError``, logs ``Kafka error occurred``
    and fetches again 5 s later: with Read on an input topic or on the group removed
    while the sidecar ran, it consumed nothing from then on and stayed ready and live
    (measured against a broker with ACLs). The error now makes the loop not live, with
    one log line naming it; the restart's start check names every ACL missing.
    """
    fetch = subscriber.get_msg

    async def get_msg(consumer: Any) -> Any:
        try:
            return await fetch(consumer)
        except AUTHORISATION_ERRORS as exc:
            state.fail(authorisation_error(exc) or repr(exc))
            raise

    subscriber.get_msg = get_msg


class BrokerProbe:
    """Keeps ``state.broker_ok``, ``state.topics_ok`` and ``state.outputs_missing`` current."""

    def __init__(
        self,
        state: LoopState,
        inputs: Sequence[str],
        outputs: Sequence[str] = (),
        *,
        clock: Callable[[], float] = time.monotonic,
        on_inputs_gone: Callable[[set[str]], None] | None = None,
    ) -> None:
        """``on_inputs_gone``: called with the input topics the probe no longer finds (seen
        before, missing from two metadata answers in a row; once each time one goes
        missing): what was read from them belongs to a topic that is gone, and must never
        be committed to one created again under the same name."""
        self.state = state
        self.inputs = tuple(inputs)
        self.outputs = tuple(t for t in dict.fromkeys(outputs) if t not in self.inputs)
        self._clock = clock
        self._outputs_seen: set[str] = set()
        self._on_inputs_gone = on_inputs_gone
        self._inputs_gone: set[str] = set()
        self._inputs_seen: set[str] = set()
        self._missing_before: set[str] = set()  # inputs the last metadata answer lacked
        self._problem_seen: dict[str, int] | None = None  # the counts the last error named

    async def probe(self, consumer: ConsumerPort) -> None:
        try:
            # not ``asyncio.wait_for``: on 3.11 it drops a cancellation that comes as the
            # answer does, and the loop went on probing after the ticker cancelled it
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                counts = await consumer.fetch_partitions(self.inputs + self.outputs)
        except (KafkaError, TimeoutError) as exc:
            if self.state.broker_ok:  # a timeout has no text of its own (audit: "()")
                why = (
                    f"no answer to a metadata request within {PROBE_TIMEOUT_S:g} s"
                    if isinstance(exc, TimeoutError)
                    else f"{type(exc).__name__}: {exc}"
                )
                log.warning("broker unreachable (%s); not ready until it is back", why)
            self.state.broker_ok = False
            return
        if not self.state.broker_ok:
            log.info("broker reachable")
        self.state.broker_ok = True
        if counts is not None:
            inputs = {t: n for t, n in counts.items() if t in self.inputs}
            self._inputs_seen.update(inputs)
            # deleted: seen before, and missing from two metadata answers in a row (one
            # answer without it may be a metadata glitch; forgetting a live topic's pending
            # offsets would commit past requests still open)
            missing = {t for t in self.inputs if t not in inputs and t in self._inputs_seen}
            gone = missing & self._missing_before
            self._missing_before = missing
            if (newly := gone - self._inputs_gone) and self._on_inputs_gone is not None:
                self._on_inputs_gone(newly)
            back = self._inputs_gone - gone  # created again: read it now, not in 5 min
            self._inputs_gone = gone
            if self.check_partition_counts(inputs) or back:
                consumer.refresh_metadata()  # the group rebalances onto the new partitions now
            self.check_outputs(counts)

    def check_outputs(self, seen: dict[str, int]) -> None:
        """An output topic seen before and gone now (deleted under the running loop) is
        missing: not ready after ``publish_stall_s``, not live after
        ``missing_topic_fatal_s``. One that was never there is left to the publishes
        that need it (a topic created a moment late is no failure)."""
        state, now = self.state, self._clock()
        for topic in self.outputs:
            if topic in seen:
                self._outputs_seen.add(topic)
                if state.outputs_missing.pop(topic, None) is not None:
                    log.warning("output topic %s exists again", topic)
            elif topic in self._outputs_seen:
                if topic not in state.outputs_missing:
                    log.error(
                        "output topic %s no longer exists; not ready in %.0fs, not live in "
                        "%.0fs unless it is created again",
                        topic, state.publish_stall_s, state.missing_topic_fatal_s,
                    )  # fmt: skip
                state.output_missing(topic, now)

    def check_partition_counts(self, seen: dict[str, int]) -> bool:
        """Readiness follows the input topics: all present, equal partition counts. True
        when they grew, equal again: the consumer must read the new partitions.

        Before, a change kept the replica not ready (but live) until someone restarted the
        group, and the consumer found the new partitions only at its next metadata refresh
        (5 min): requests keyed to them waited that long for a verdict.
        """
        state = self.state
        problem = partition_count_problem(self.inputs, seen)
        first = not state.input_partitions
        grew = problem is None and not first and seen != state.input_partitions
        if grew:
            log.warning(
                "input topics: partition counts changed from %s to %s; reading the new "
                "partitions (the group rebalances). Keys now hash to other partitions: a "
                "request written across the change may have its halves in two partitions and "
                "be decided incomplete, once for each half",
                format_counts(state.input_partitions), format_counts(seen),
            )  # fmt: skip
            state.input_partitions = seen
        ok = problem is None
        if not ok and (state.topics_ok or seen != self._problem_seen):
            log.error("input topics: %s; not ready", problem)  # once per change, not per probe
        self._problem_seen = None if ok else seen
        if first and ok:
            state.input_partitions = seen
        state.topics_ok = ok
        return grew

    async def run(self, consumer: ConsumerPort, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.probe(consumer)
            await asyncio.sleep(PROBE_INTERVAL_S)

    def check_assignment(self, assigned: set[TP], counts: dict[str, int], group: str) -> None:
        """A new assignment: check that it keeps every partition number's inputs together."""
        self.state.assigned = assigned
        self.state.group_joined = True
        self.state.split = split_pairs(assigned, self.inputs, counts or None)
        for problem in self.state.split:
            log.error(
                "assignment splits co-partitioned inputs: this member %s (group %s: every "
                "member must use the %s assignor); not ready",
                problem,
                group,
                "guardrail-copartition",
            )
