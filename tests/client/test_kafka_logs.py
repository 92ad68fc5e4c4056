"""``calm_kafka_logs``: the LLM service's opt-in to aiokafka's retried errors at WARNING.

The sidecar's handlers demote these lines (``sidecar.lograte``); the client's process has
handlers of its own, so the opt-in filters the aiokafka loggers that emit them: every
handler of the service sees the record at WARNING, whoever configured it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator

import aiokafka.errors as kafka_errors
import pytest

from guardrail_client import calm_kafka_logs
from sidecar.kafka_logs import RetriedKafkaErrors


class Keep(logging.Handler):
    """A handler that keeps what reaches it."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # as it was here: a filter on a later handler may rewrite the record in place
        self.records.append(copy.copy(record))


@contextlib.contextmanager
def service_handlers() -> Iterator[tuple[Keep, Keep]]:
    """A service's two handlers: everything from WARNING, and an ERROR alert; the opt-in's
    filters, if the block added them, are taken off again after it.

    On the ``aiokafka`` logger, which every line here propagates through before the root:
    a handler filter another test left on the root's handlers (the CLI's, run in-process,
    on pytest's capture handler) rewrites a record in place before later handlers see it.
    """
    top = logging.getLogger("aiokafka")
    warnings, alerts = Keep(logging.WARNING), Keep(logging.ERROR)
    top.addHandler(warnings)
    top.addHandler(alerts)
    try:
        yield warnings, alerts
    finally:
        top.removeHandler(warnings)
        top.removeHandler(alerts)
        for name in calm_kafka_logs():  # the loggers it filters (none added that were not)
            logger = logging.getLogger(name)
            for f in [f for f in logger.filters if isinstance(f, RetriedKafkaErrors)]:
                logger.removeFilter(f)


@pytest.fixture
def handlers() -> Iterator[tuple[Keep, Keep]]:
    with service_handlers() as both:
        yield both


def _log(name: str, msg: str, *args: object) -> None:
    logging.getLogger(name).error(msg, *args)


def test_without_the_opt_in_the_client_touches_no_logger(handlers: tuple[Keep, Keep]) -> None:
    _, alerts = handlers
    closed = kafka_errors.KafkaConnectionError("Connection at 127.0.0.1:9093 closed")
    _log("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, closed)
    assert [r.levelno for r in alerts.records] == [logging.ERROR]  # as aiokafka logs it


def test_a_broker_away_reaches_the_services_handlers_at_warning(
    handlers: tuple[Keep, Keep],
) -> None:
    warnings, alerts = handlers
    names = calm_kafka_logs()
    assert calm_kafka_logs() == names  # a second call adds nothing
    for name in names:
        assert sum(isinstance(f, RetriedKafkaErrors) for f in logging.getLogger(name).filters) == 1
    closed = kafka_errors.KafkaConnectionError("Connection at 127.0.0.1:9093 closed")
    not_ready = kafka_errors.NodeNotReadyError("Attempt to send a request to node 2")
    _log("aiokafka", "Unable connect to node with id %s: %s", 2, closed)
    _log("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 2, not_ready)
    _log(
        "aiokafka.consumer.group_coordinator",
        "Heartbeat session expired - marking coordinator dead",
    )
    assert alerts.records == []  # the service's ERROR alert stays quiet
    assert [r.levelno for r in warnings.records] == [logging.WARNING] * 3
    assert warnings.records[0].getMessage() == (
        "Unable connect to node with id 2: KafkaConnectionError: Connection at 127.0.0.1:9093 "
        "closed (retried: a broker restarting or handing over)"
    )
    assert warnings.records[2].getMessage().endswith("(rejoining the group)")


def test_an_authorisation_failure_or_another_logger_stays_an_error(
    handlers: tuple[Keep, Keep],
) -> None:
    _, alerts = handlers
    calm_kafka_logs()
    denied = kafka_errors.TopicAuthorizationFailedError("rag.verdicts")
    closed = kafka_errors.KafkaConnectionError("Connection at 127.0.0.1:9093 closed")
    _log("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, denied)
    _log("aiokafka.producer.sender", "Failed fetch messages from %s: %s", 1, closed)
    _log("aiokafka", "Unable to update metadata from %s", [1, 2, 3])
    assert [r.levelno for r in alerts.records] == [logging.ERROR] * 3


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_one_line_is_one_line_per_interval_with_a_count(
    handlers: tuple[Keep, Keep],
) -> None:
    """A killed broker's retries logged 354 "Unable connect to node" lines in 10 s in the
    cluster test's service process."""
    warnings, _ = handlers
    clock = _Clock()
    logger = logging.getLogger("aiokafka")
    logger.addFilter(RetriedKafkaErrors(interval_s=10.0, clock=clock))
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9093)")
    for _ in range(100):
        _log("aiokafka", "Unable connect to node with id %s: %s", 2, refused)
        clock.now += 0.05
    _log("aiokafka", "Unable connect to node with id %s: %s", 3, refused)  # another id: counted
    denied = kafka_errors.TopicAuthorizationFailedError("rag.verdicts")
    _log("aiokafka", "Unable connect to node with id %s: %s", 2, denied)  # not demoted: passes
    assert [r.levelno for r in warnings.records] == [logging.WARNING, logging.ERROR]
    clock.now += 10.0
    _log("aiokafka", "Unable connect to node with id %s: %s", 2, refused)
    last = warnings.records[-1]
    assert last.levelno == logging.WARNING
    assert last.getMessage().endswith("[100 more like it in the last 15 s]"), last.getMessage()


def test_the_producers_retried_warnings_keep_their_level_one_per_interval(
    handlers: tuple[Keep, Keep],
) -> None:
    warnings, alerts = handlers
    calm_kafka_logs()
    closed = kafka_errors.KafkaConnectionError("Connection at 127.0.0.1:9093 closed")
    sender = logging.getLogger("aiokafka.producer.sender")
    for _ in range(50):
        sender.warning("Got error produce response: %s", closed)
    sender.warning("Cannot send %r to %s: %r", "ProduceRequest", 1, closed)  # not in the table
    assert [r.getMessage() for r in warnings.records] == [
        "Got error produce response: KafkaConnectionError: Connection at 127.0.0.1:9093 closed",
        "Cannot send 'ProduceRequest' to 1: KafkaConnectionError('Connection at "
        "127.0.0.1:9093 closed')",
    ]
    assert alerts.records == []
