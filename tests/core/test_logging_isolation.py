"""One test's in-process ``guardrail`` call leaves no filter behind for the next
(``tests/conftest.py``'s ``_logging_as_it_was``): the two tests run in this order."""

from __future__ import annotations

import logging

from sidecar.cli.main import main
from sidecar.lograte import StartupTransients


def _guardrail_filters() -> list[logging.Filter]:
    return [
        f
        for handler in logging.getLogger().handlers
        for f in handler.filters
        if isinstance(f, StartupTransients)
    ]


def test_an_in_process_guardrail_call_puts_its_filters_on_the_root_handlers() -> None:
    assert main(["config", "show"]) == 0
    assert _guardrail_filters()  # what main does to every handler, pytest's among them
    assert logging.getLogger("aiokafka").level == logging.WARNING


def test_the_next_test_finds_the_handlers_as_they_were() -> None:
    assert _guardrail_filters() == []
    assert logging.getLogger("aiokafka").level == logging.NOTSET
