"""Shared fixtures: settings and event factories, the real Kafka broker, CI guards.

``--require-connected`` (used by the CI command) fails the session when no test
marked ``connected`` ran or any was skipped: the real-broker set can never
silently disappear.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import logging
import os
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import settings as hypothesis_settings

from sidecar.config import Settings
from sidecar.lab.localkafka.broker import (
    LocalKafka,
    ensure_jars,
    free_port,
    kafka_version,
    lib_for,
)
from sidecar.lograte import limit_repeats, one_line

REPO = Path(__file__).resolve().parents[1]

# Property tests draw the same examples on every run (fixed seeds: a red CI run is a
# bug anyone can reproduce, not a draw); ``HYPOTHESIS_PROFILE=explore`` draws new ones.
hypothesis_settings.register_profile("fixed", derandomize=True, database=None)
hypothesis_settings.register_profile("explore")
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def kafka_lib() -> Path:
    """The lab broker's jars: ``$KAFKA_LOCAL_VERSION``'s (default 4.3.1), fetched
    under ``$KAFKA_LOCAL_HOME`` (default the checkout's ``.kafka``) on first use."""
    return ensure_jars(lib_for(Path(os.environ.get("KAFKA_LOCAL_HOME") or REPO / ".kafka")))


# ------------------------------------------------------------------ CI guard

_connected: dict[str, int] = {"passed": 0, "skipped": 0, "failed": 0}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-connected",
        action="store_true",
        help="fail the run if real-broker (connected) tests were skipped or none ran",
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "connected" not in report.keywords:
        return
    if report.skipped:
        _connected["skipped"] += 1
    elif report.when == "call":
        _connected["passed" if report.passed else "failed"] += 1


def pytest_report_header(config: pytest.Config) -> str:
    """Which broker release the real-broker tests run against (``KAFKA_LOCAL_VERSION``)."""
    return f"lab Kafka broker: {kafka_version()} (KAFKA_LOCAL_VERSION)"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.getoption("--require-connected"):
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    line = (
        f"connected (real Kafka broker) tests: passed={_connected['passed']} "
        f"failed={_connected['failed']} skipped={_connected['skipped']}"
    )
    if tr is not None:
        tr.write_line(line)
    if _connected["passed"] == 0 or _connected["skipped"] > 0:
        if tr is not None:
            tr.write_line("FAIL: the real-broker test set was skipped or empty")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ------------------------------------------------------------------ hang report

TASK_DUMP_LEAD_S = 15.0  # before pytest-timeout fails the test


def _running_loops() -> list[asyncio.AbstractEventLoop]:
    """The running event loops among all objects. ``type(o)``, not ``isinstance``: that reads
    ``o.__class__``, and a deprecated torch object warns on it (an error under
    ``filterwarnings = error``), which ended the dump of a hung test before it printed."""
    return [
        o
        for o in gc.get_objects()
        if issubclass(type(o), asyncio.AbstractEventLoop) and o.is_running()
    ]


def _print_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Every task of ``loop`` with the line it waits on (called in the loop's thread)."""
    out = io.StringIO()
    tasks = asyncio.all_tasks(loop)
    print(f"+++ {len(tasks)} asyncio tasks, {TASK_DUMP_LEAD_S:.0f} s before the timeout", file=out)
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"task {task.get_name()}:", file=out)
        awaitable: Any = task.get_coro()
        while awaitable is not None:  # down the chain of awaits, to the one that waits
            frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
            if frame is None:
                print(f"    awaiting {awaitable!r:.200}", file=out)
                break
            print(
                f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", file=out
            )
            awaitable = getattr(awaitable, "cr_await", None) or getattr(
                awaitable, "gi_yieldfrom", None
            )
    sys.stderr.write(out.getvalue())


_DUMP_TIMER = pytest.StashKey[threading.Timer]()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    """pytest-timeout's own timer, with ours ``TASK_DUMP_LEAD_S`` ahead of it: a test about
    to time out prints its event loop's tasks. pytest-timeout shows the threads, and an
    idle loop waiting on a future that never completes shows nothing there (CI hung twice
    in ``select()``, with no clue which await it was). Returns None: its timer still runs."""
    if settings.timeout <= 2 * TASK_DUMP_LEAD_S:
        return

    def dump() -> None:
        try:
            for loop in _running_loops():
                loop.call_soon_threadsafe(_print_tasks, loop)
        except Exception as exc:  # a report that failed must not fail the test
            sys.stderr.write(f"+++ the asyncio task dump failed: {exc!r}\n")

    timer = threading.Timer(settings.timeout - TASK_DUMP_LEAD_S, dump)
    timer.daemon = True
    timer.start()
    item.stash[_DUMP_TIMER] = timer


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    timer = item.stash.get(_DUMP_TIMER, None)
    if timer is not None:
        timer.cancel()
        timer.join()  # gone before the next test counts threads, as pytest-timeout's own


# ------------------------------------------------------------------ factories

EventFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def retrieval_event() -> EventFactory:
    def make(request_id: str = "req-1", **overrides: Any) -> dict[str, Any]:
        event: dict[str, Any] = {
            "schema_version": 1,
            "event_type": "retrieval",
            "request_id": request_id,
            "tenant": "acme",
            "collection": "wiki",
            "retriever": "qdrant-minilm-l6",
            "query": "who wrote frankenstein",
            "k": 2,
            "hits": [
                {
                    "chunk_id": "c1",
                    "doc_id": "d1",
                    "score": 0.71,
                    "text": "Mary Shelley wrote Frankenstein.",
                },
                {
                    "chunk_id": "c2",
                    "doc_id": "d2",
                    "score": 0.33,
                    "text": "Gothic fiction is a genre.",
                },
            ],
        }
        event.update(overrides)
        return event

    return make


@pytest.fixture
def final_event() -> EventFactory:
    def make(request_id: str = "req-1", **overrides: Any) -> dict[str, Any]:
        event: dict[str, Any] = {
            "schema_version": 1,
            "event_type": "generation.final",
            "request_id": request_id,
            "answer": "Frankenstein was written by Mary Shelley.",
            "generator_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        }
        event.update(overrides)
        return event

    return make


@pytest.fixture
def delta_event() -> EventFactory:
    def make(request_id: str = "req-1", seq: int = 0, text: str = "Frank") -> dict[str, Any]:
        return {
            "schema_version": 1,
            "event_type": "generation.delta",
            "request_id": request_id,
            "seq": seq,
            "text": text,
        }

    return make


def dumps(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


@pytest.fixture
def settings_factory() -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return Settings.load(**overrides)

    return make


# ------------------------------------------------------------------ the real broker


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A real Apache Kafka broker (KRaft, single node) for this test session.

    It fails (never skips) when the broker cannot start: a missing broker is a
    broken environment, not a reason to pass.
    """
    lib = kafka_lib()
    instance = tmp_path_factory.mktemp("kafka")
    broker = LocalKafka(instance, lib, port=free_port(), controller_port=free_port())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(instance, ignore_errors=True)


@pytest.fixture
def unique_topics() -> dict[str, str]:
    """A uuid-suffixed topic set and group per test."""
    suffix = uuid.uuid4().hex[:10]
    return {
        "retrieval": f"t.{suffix}.retrieval",
        "generation": f"t.{suffix}.generation",
        "claims": f"t.{suffix}.claims",
        "verdicts": f"t.{suffix}.verdicts",
        "dlq": f"t.{suffix}.dlq",
        "feedback": f"t.{suffix}.feedback",
        "reports": f"t.{suffix}.reports",
        "certificates": f"t.{suffix}.certificates",
        "group": f"g.{suffix}",
    }


class LogLines(logging.Handler):
    """What the root logger writes, filtered as ``guardrail`` sets it up (``limit_repeats``,
    ``one_line``): each record's message, and its text as written (tracebacks included)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.written: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.written.append(self.format(record) + "\n")


@pytest.fixture
def log_lines() -> Iterator[LogLines]:
    """The root logger's only handler for the test, as the command line's would be."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    handler = LogLines()
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    limit_repeats(root.handlers)
    one_line(root.handlers)
    try:
        yield handler
    finally:
        root.handlers = saved
        root.setLevel(level)


# loggers whose levels ``guardrail``'s ``main`` sets (sidecar/cli/main.py)
_CLI_LOGGERS = ("aiokafka", "faststream", "kafka", "opentelemetry.baggage")


@contextlib.contextmanager
def logging_as_it_was() -> Iterator[None]:
    """Inside it, the root logger's handlers' filters and the Kafka clients' logger levels
    may change; on the way out they are as they were. An in-process ``guardrail`` call
    (``sidecar.cli.main.main``) puts its filters on every root handler, pytest's
    session-long capture handlers among them, and left them there: a later test's aiokafka
    ERROR reached its handlers rewritten to WARNING (the client's log tests read it so in
    CI). A module-scoped fixture that calls ``main`` wraps the call in it."""
    root = logging.getLogger()
    filters = {handler: handler.filters[:] for handler in root.handlers}
    levels = {name: logging.getLogger(name).level for name in _CLI_LOGGERS}
    try:
        yield
    finally:
        for handler, kept in filters.items():
            handler.filters[:] = kept
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Each test leaves logging as it found it (:func:`logging_as_it_was`)."""
    with logging_as_it_was():
        yield
