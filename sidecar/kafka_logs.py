"""aiokafka's ERROR lines for what it retries, at WARNING: the sidecar's and the client's.

aiokafka logs at ERROR a bootstrap server that does not answer, a broker it cannot reach
for the moment and a group session that expired, and retries each (on another broker once
the cluster has moved that one's leaderships). During a routine rolling restart of a
three-node cluster that was 13-23 ERROR lines per process while every request was decided
(tests/kafka/test_cluster_restarts_real.py). :data:`DEMOTIONS` names those lines; the
sidecar's log filter (``sidecar.lograte.StartupTransients``) applies them on its handlers,
and an LLM service opts in with ``guardrail_client.calm_kafka_logs`` (its handlers are its
own: the client touches no logger unless asked). An authorisation failure on the same
lines, or any other cause, stays at ERROR. Logging only, so that both import it cheaply:
in ``guardrail_client`` it made ``sidecar.lograte`` pull the client's whole package, and
every ``guardrail`` command's imports took 520 ms instead of 63.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BOOTSTRAP_MISSES",
    "BROKER_AWAY_CAUSES",
    "BROKER_AWAY_LINES",
    "DEMOTIONS",
    "REJOINS",
    "REPEAT_INTERVAL_S",
    "RETRIED_WARNINGS",
    "Demotion",
    "RetriedKafkaErrors",
    "calm_kafka_logs",
    "demote_retried",
    "relevel",
]

REPEAT_INTERVAL_S: Final = 10.0

# aiokafka's ERROR for each bootstrap server that does not answer, logged as it goes on to
# the next one in the list (when none answers, the start fails and says so itself): with a
# cluster's three servers, one broker restarting made every client started meanwhile log an
# ERROR while it served; a WARNING, since a server that never answers is worth fixing
BOOTSTRAP_MISSES: Final = (("aiokafka", 'Unable connect to "%s:%s": %s'),)

# aiokafka's ERRORs for one broker it cannot reach just now, each retried on its own (on
# another broker once the cluster moved that one's leaderships and coordinators): a rolling
# restart of a three-node cluster logged 13-23 of them per sidecar while every request was
# decided (tests/kafka/test_cluster_restarts_real.py). At WARNING when the cause is the
# connection (the class names and OS errors below); the sidecar says itself, at WARNING,
# when no broker answers ("broker unreachable ...; not ready until it is back").
BROKER_AWAY_LINES: Final = (
    ("aiokafka", "Unable connect to node with id %s: %s"),
    ("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s"),
    ("aiokafka.consumer.fetcher", "Failed fetch offsets from %s: %s"),
    ("aiokafka.consumer.group_coordinator", "Group Coordinator Request failed: %s"),
    ("aiokafka.consumer.group_coordinator", "Heartbeat send request failed: %s. Will retry."),
    (
        "aiokafka.consumer.group_coordinator",
        "Error sending %s to node %s [%s] -- marking coordinator dead",
    ),
)
BROKER_AWAY_CAUSES: Final = ("KafkaConnectionError", "NodeNotReadyError", "StaleMetadata", "[Errno")
# no heartbeat answered within the session timeout (its coordinator's node killed, or this
# process stalled): the member rejoins, and the partitions' next owner decides what was not
# committed again, with the same idempotency keys. Java's consumer says as much at INFO.
REJOINS: Final = (
    ("aiokafka.consumer.group_coordinator", "Heartbeat session expired - marking coordinator dead"),
)


@dataclass(frozen=True, slots=True)
class Demotion:
    """Client lines logged at ERROR for what the client retries: at WARNING, with a note,
    when the rendered text names one of ``causes`` (any text when there are none)."""

    lines: tuple[tuple[str, str], ...]  # (logger name, message template)
    note: str
    causes: tuple[str, ...] = ()


# aiokafka's own WARNINGs for a produce request it retries: 132 in 13 s from one process's
# producers while a killed broker's leaderships moved (tests/kafka/test_cluster_restarts_real.py).
# The opt-in keeps their level and lets one of each through per interval, with a count.
RETRIED_WARNINGS: Final = (
    ("aiokafka.producer.sender", "Got error produce response: %s"),
    (
        "aiokafka.producer.sender",
        "Got error produce response on topic-partition %s, retrying. Error: %s",
    ),
)

DEMOTIONS: Final = (
    Demotion(BOOTSTRAP_MISSES, "trying the next bootstrap server, if any"),
    Demotion(REJOINS, "rejoining the group"),
    Demotion(BROKER_AWAY_LINES, "retried: a broker restarting or handing over", BROKER_AWAY_CAUSES),
)


def demote_retried(record: logging.LogRecord) -> bool:
    """``record`` at WARNING with its note when it is one of :data:`DEMOTIONS`' lines at
    ERROR (or above) with one of its causes; says whether it was."""
    if record.levelno <= logging.WARNING:
        return False
    line = (record.name, record.msg)
    for demotion in DEMOTIONS:
        if line not in demotion.lines:
            continue
        text = record.getMessage()
        if not demotion.causes or any(cause in text for cause in demotion.causes):
            relevel(record, logging.WARNING, f"{text} ({demotion.note})")
            return True
    return False


class RetriedKafkaErrors(logging.Filter):
    """:func:`demote_retried` on the Kafka client's own loggers (:func:`calm_kafka_logs`),
    and at most one of each demoted line (logger, template), and of
    :data:`RETRIED_WARNINGS`, per ``interval_s``: the next one after it says how many were
    dropped meanwhile. A killed broker's retries logged
    354 "Unable connect to node" lines in 10 s in a service's process."""

    def __init__(
        self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}  # bounded: the two tables' lines
        self._dropped: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()  # the sync client logs from its loop thread

    def filter(self, record: logging.LogRecord) -> bool:
        line = (record.name, str(record.msg))
        if not demote_retried(record) and (
            line not in RETRIED_WARNINGS or record.levelno != logging.WARNING
        ):
            return True
        now = self._clock()
        with self._lock:
            last = self._last.get(line)
            if last is not None and now - last < self.interval_s:
                self._dropped[line] = self._dropped.get(line, 0) + 1
                return False
            self._last[line] = now
            dropped = self._dropped.pop(line, 0)
        if dropped and last is not None:
            record.msg = f"{record.msg} [{dropped} more like it in the last {now - last:.0f} s]"
        return True


def calm_kafka_logs(interval_s: float = REPEAT_INTERVAL_S) -> list[str]:
    """One :class:`RetriedKafkaErrors` on each aiokafka logger :data:`DEMOTIONS` and
    :data:`RETRIED_WARNINGS` name: the retried connection errors reach every handler at
    WARNING, whoever configured the handlers, and at most one of each such line per
    ``interval_s`` (the guardrail client's opt-in for the LLM service's process). Returns
    the loggers' names; a second call adds nothing."""
    lines = [*RETRIED_WARNINGS, *(line for demotion in DEMOTIONS for line in demotion.lines)]
    names = sorted({name for name, _ in lines})
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RetriedKafkaErrors) for f in logger.filters):
            logger.addFilter(RetriedKafkaErrors(interval_s))
    return names


def relevel(record: logging.LogRecord, level: int, text: str) -> None:
    """``record`` at ``level`` with ``text`` as its whole message."""
    record.levelno, record.levelname = level, logging.getLevelName(level)
    record.msg, record.args = text, None
