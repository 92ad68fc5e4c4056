"""The Kafka client's repeated log lines: one per interval, with a count of the rest."""

from __future__ import annotations

import io
import logging

import pytest

from sidecar.cli.main import main
from sidecar.lograte import RepeatFilter, limit_repeats


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def _record(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_repeated_client_line_goes_through_once_per_interval_with_a_count() -> None:
    """aiokafka logged ``Topic ... not found in cluster metadata`` ~2,700 times a second
    while a deleted verdict topic held records (at ERROR: the WARNING floor let it through)."""
    clock = Clock()
    limiter = RepeatFilter(interval_s=10.0, clock=clock)
    msg = "Topic %s not found in cluster metadata"
    shown: list[str] = []
    for _ in range(3_000):  # one second of the flood
        record = _record("aiokafka.cluster", msg, "rag.verdicts")
        if limiter.filter(record):
            shown.append(record.getMessage())
        clock.now += 1 / 3_000
    assert shown == ["Topic rag.verdicts not found in cluster metadata"]
    clock.now += 9.2  # the interval since the line that went through is over
    record = _record("aiokafka.cluster", msg, "rag.verdicts")
    assert limiter.filter(record)
    assert record.getMessage() == (
        "Topic rag.verdicts not found in cluster metadata "
        "(2999 more like it in the last 10s not logged)"
    )
    clock.now += 1.0
    assert not limiter.filter(_record("aiokafka.cluster", msg, "rag.verdicts"))


def test_other_messages_loggers_and_levels_are_counted_apart() -> None:
    clock = Clock()
    limiter = RepeatFilter(interval_s=10.0, clock=clock)
    msg = "Topic %s not found in cluster metadata"
    assert limiter.filter(_record("aiokafka.cluster", msg, "rag.verdicts"))
    assert limiter.filter(_record("aiokafka.cluster", msg, "rag.claims"))  # another topic
    assert limiter.filter(_record("aiokafka.cluster", msg, "rag.verdicts", level=logging.WARNING))
    assert limiter.filter(_record("faststream.access", msg, "rag.verdicts"))
    for _ in range(5):  # the sidecar's own lines are never held back
        assert limiter.filter(_record("sidecar.kafka", "publish to %s failed", "rag.verdicts"))
        assert limiter.filter(_record("aiokafkaesque", "not one of aiokafka's loggers"))
    assert not limiter.filter(_record("aiokafka.cluster", msg, "rag.claims"))


def test_the_command_line_limits_repeats_of_the_client_loggers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root.handlers = [handler]
    try:
        assert main(["config", "show"]) == 0  # configures logging as ``guardrail run`` does
        capsys.readouterr()
        limit_repeats(root.handlers)  # once per handler
        assert [type(f) for f in handler.filters] == [RepeatFilter]
        flood = logging.getLogger("aiokafka.cluster")
        for _ in range(100):
            flood.error("Topic %s not found in cluster metadata", "rag.verdicts")
        assert stream.getvalue().count("not found in cluster metadata") == 1
    finally:
        root.handlers = saved
