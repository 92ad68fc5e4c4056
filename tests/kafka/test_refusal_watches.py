"""Overlapping refusal watches (``AuthRefusals.watching``) leave ``aiokafka.conn`` as they
found it. Each watch used to save the logger's level, set DEBUG and put its saved level
back; two side by side (an assignment's verdicts and labels reads) left it at DEBUG, and
every fetch's request and response went to the sidecar's log from then on."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from sidecar.kafka.topics import AuthRefusals

CONN = logging.getLogger("aiokafka.conn")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def shown() -> Iterator[Lines]:
    """What the log shows of aiokafka: from WARNING, as ``guardrail`` sets it."""
    aiokafka = logging.getLogger("aiokafka")
    level = aiokafka.level
    aiokafka.setLevel(logging.WARNING)
    lines = Lines()
    aiokafka.addHandler(lines)
    try:
        yield lines
    finally:
        aiokafka.removeHandler(lines)
        aiokafka.setLevel(level)


def test_overlapping_watches_leave_the_connection_logger_as_it_was(shown: Lines) -> None:
    level, filters = CONN.level, CONN.filters[:]
    first, second = AuthRefusals(), AuthRefusals()
    a, b = first.watching(), second.watching()
    a.__enter__()
    b.__enter__()
    # a refused client certificate's TLS alert, at DEBUG: both watches read it
    CONN.debug("connection closed: [SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert (_ssl.c:1)")
    a.__exit__(None, None, None)  # the first ends before the second (side by side)
    CONN.debug("FetchResponse_v11(...)")  # the second still watching: not shown
    b.__exit__(None, None, None)
    CONN.debug("FetchResponse_v11(...)")  # nobody watching: not even made
    CONN.warning("Unable connect to node with id 1")
    assert (CONN.level, CONN.filters) == (level, filters)
    assert first.client_cert and second.client_cert
    assert shown.lines == ["Unable connect to node with id 1"]
