"""The Kafka client's repeated log lines: one per interval, with a count of the rest."""

from __future__ import annotations

import argparse
import gc
import io
import logging
import sys
import threading
from collections.abc import Callable

import pytest

from sidecar.cli import main as cli_main
from sidecar.cli.main import main
from sidecar.lograte import (
    PER_INPUT,
    OneLine,
    RepeatFilter,
    StartupTransients,
    limit_repeats,
    one_line,
    report_repeats,
)


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
        assert [type(f) for f in handler.filters] == [StartupTransients, RepeatFilter, OneLine]
        flood = logging.getLogger("aiokafka.cluster")
        for _ in range(100):
            flood.error("Topic %s not found in cluster metadata", "rag.verdicts")
        assert stream.getvalue().count("not found in cluster metadata") == 1
    finally:
        root.handlers = saved


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.levelno, record.getMessage()))


def test_when_a_flood_stops_its_last_count_is_still_written() -> None:
    """The count went out only with the message's next line: a flood that stopped left the
    lines it dropped in its last interval unsaid."""
    clock = Clock()
    handler = _Lines()
    limiter = RepeatFilter(interval_s=10.0, clock=clock)
    handler.addFilter(limiter)
    msg = "Topic %s not found in cluster metadata"
    for _ in range(500):
        handler.handle(_record("aiokafka.cluster", msg, "rag.verdicts"))
        clock.now += 0.01
    handler.handle(_record("aiokafka.conn", "quiet once", level=logging.WARNING))
    assert report_repeats([handler]) == 0  # the interval runs: nothing to say yet
    clock.now += 6.0
    assert report_repeats([handler]) == 1
    assert handler.lines[-1] == (
        "aiokafka.cluster",
        logging.ERROR,
        "Topic rag.verdicts not found in cluster metadata "
        "(499 more like it not logged, the last 6s ago)",
    )
    assert report_repeats([handler]) == 0  # said once
    clock.now += 1.0  # a new flood of the same line: its first line goes through at once
    handler.handle(_record("aiokafka.cluster", msg, "rag.verdicts"))
    assert handler.lines[-1][2] == "Topic rag.verdicts not found in cluster metadata"
    handler.handle(_record("aiokafka.cluster", msg, "rag.verdicts"))
    assert report_repeats([handler], every=True) == 1  # at exit, before the interval ends
    assert handler.lines[-1][2].endswith("(1 more like it not logged, the last 0s ago)")
    assert [line[2] for line in handler.lines].count("quiet once") == 1


def test_a_line_logged_on_another_thread_while_the_ticker_counts_does_not_break_it() -> None:
    """The ticker (the loop's thread) writes the counts while the processor thread logs
    its per-input lines: logging runs a handler's filters outside the handler's lock, so
    both threads are in the one ``RepeatFilter`` at once. Unlocked, a line whose message
    was new, logged while ``ended`` looked through the messages, failed it with
    "dictionary changed size during iteration", out of the tick: the ticker, which
    commits and expires the join, was gone (and the count it held with it)."""
    ticker = threading.current_thread()
    switch, logged = threading.Event(), threading.Event()

    class Stamp(float):
        """A clock reading: the ticker's subtraction in ``ended`` is where the thread
        switch comes (the interpreter switches threads between any two bytecodes)."""

        def __sub__(self, other: float) -> float:
            if threading.current_thread() is ticker and switch.is_set():
                switch.clear()
                other_thread.set()
                logged.wait(0.5)  # it logs now, or waits for the filter's lock
            return float(self) - float(other)

    handler = _Lines()
    limiter = RepeatFilter(interval_s=10.0, clock=lambda: Stamp(500.0))
    handler.addFilter(limiter)
    for text in ("flood", "flood", "flood", "quiet"):
        handler.handle(_record("aiokafka.conn", text))
    other_thread = threading.Event()

    def processor() -> None:
        other_thread.wait(5.0)
        record = _record("sidecar.pipeline", "scoring failed for %s", "req-1")
        record.__dict__.update(PER_INPUT)
        handler.handle(record)
        logged.set()

    worker = threading.Thread(target=processor)
    worker.start()
    switch.set()
    try:
        assert report_repeats([handler]) == 0  # no interval has ended: nothing to say yet
    finally:
        other_thread.set()
        worker.join()
    assert [line[2] for line in handler.lines] == ["flood", "quiet", "scoring failed for req-1"]
    assert report_repeats([handler], every=True) == 1
    assert handler.lines[-1][2] == "flood (2 more like it not logged, the last 0s ago)"


def test_a_line_logged_by_a_finalizer_inside_the_filter_does_not_hang_its_thread() -> None:
    """The garbage collector runs finalizers in the middle of an allocation, on the thread
    that allocates; aiokafka's and asyncio's ``__del__`` log an unclosed connection. One
    run while the filter held its lock logged through that same filter: the line waited on
    the lock its own thread held, and that thread (the event loop's) hung for good."""
    handler = _Lines()
    inside = {"counting": False, "ending": False}

    class Stamp(float):
        """A clock reading; subtracting it is where a finalizer logs, as the GC may."""

        def __sub__(self, other: float) -> float:
            for where, pending in inside.items():
                if pending:
                    inside[where] = False
                    handler.handle(_record("aiokafka.conn", f"unclosed connection ({where})"))
            return float(self) - float(other)

    now = {"t": 100.0}
    handler.addFilter(RepeatFilter(interval_s=10.0, clock=lambda: Stamp(now["t"])))

    def logs() -> None:
        for _ in range(3):
            handler.handle(_record("aiokafka.conn", "flood"))
        inside["counting"] = True
        handler.handle(_record("aiokafka.conn", "flood"))  # the finalizer runs in here
        now["t"] += 20.0
        inside["ending"] = True
        report_repeats([handler])  # and in here

    thread = threading.Thread(target=logs, daemon=True)
    thread.start()
    thread.join(10.0)
    assert not thread.is_alive(), "the thread hung on the filter's own lock"
    assert [line[2] for line in handler.lines] == [
        "flood",
        "unclosed connection (counting)",
        "unclosed connection (ending)",
        "flood (3 more like it not logged, the last 20s ago)",
    ]


def test_a_finalizer_the_collector_runs_as_the_filter_lets_its_lock_go_does_not_hang() -> None:
    """A real collection, not a stand-in: on the thread that holds the filter's lock, the
    lock's own ``__exit__`` allocates (the tuple of its arguments), and an allocation can
    run the collector and a finalizer that logs. The thread noted as the holder was
    cleared before that, so the line waited on the lock its own thread held: hung.

    Deterministic on CPython 3.11: the collector runs at every allocation of a tracked
    object (threshold 1, and each finalizer allocates), and each finalizer leaves the free
    list of 3-tuples empty, so the ``__exit__`` call's tuple is such an allocation."""
    handler = _Lines()
    handler.addFilter(RepeatFilter(interval_s=10.0))
    armed = threading.Event()
    held: list[object] = []

    class Unclosed:
        """Cyclic garbage that logs when finalized (aiokafka's unclosed connection)."""

        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            if armed.is_set():
                handler.handle(_record("aiokafka.conn", "unclosed connection"))
                Unclosed()  # the next collection's garbage
                held.append([(i, i, i) for i in range(2_100)])  # past the free list's 2,000

    done = threading.Event()

    def logs() -> None:
        handler.handle(_record("aiokafka.conn", "flood"))
        armed.set()
        Unclosed()
        for _ in range(3):
            handler.handle(_record("aiokafka.conn", "flood"))
        armed.clear()
        done.set()

    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        threading.Thread(target=logs, daemon=True).start()
        hung = not done.wait(20.0)
    finally:
        armed.clear()  # a hung thread holds the lock: no finalizer may log through it again
        gc.set_threshold(*threshold)
        held.clear()
    assert not hung, "the thread hung on the filter's own lock"
    assert [line[2] for line in handler.lines] == ["flood", "unclosed connection"]


def _command_line(
    monkeypatch: pytest.MonkeyPatch, command: Callable[[argparse.Namespace], int]
) -> _Lines:
    """``guardrail`` running ``command`` (logging configured as for ``guardrail run``),
    the root logger's lines caught."""
    parser = argparse.ArgumentParser()
    parser.set_defaults(func=command)
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    root = logging.getLogger()
    saved = root.handlers[:]
    handler = _Lines()
    root.handlers = [handler]
    try:
        assert main([]) == 0
    finally:
        root.handlers = saved
    return handler


def test_the_command_line_writes_the_counts_it_held_back_on_its_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def flood(args: argparse.Namespace) -> int:
        del args
        for _ in range(50):
            logging.getLogger("aiokafka.cluster").error("Topic %s not found", "rag.x")
        return 0

    handler = _command_line(monkeypatch, flood)
    assert [line[2] for line in handler.lines if line[0] == "aiokafka.cluster"] == [
        "Topic rag.x not found",
        "Topic rag.x not found (49 more like it not logged, the last 0s ago)",
    ]


def test_a_producers_varied_junk_under_one_template_is_one_line_per_interval() -> None:
    """Audit: a ``baggage`` header of 180 malformed members gave 180 WARNING lines per
    verdict from OpenTelemetry's propagator, each with the producer's text in it."""
    clock = Clock()
    limiter = RepeatFilter(interval_s=10.0, clock=clock)
    template = "Baggage list-member `%s` doesn't match the format"
    passed = [
        limiter.filter(_record("opentelemetry.baggage.propagation", template, f"k{i:03d}"))
        for i in range(180)
    ]
    assert passed == [True] + [False] * 179
    clock.now += 10.0
    record = _record("opentelemetry.baggage.propagation", template, "k999")
    assert limiter.filter(record)
    assert record.getMessage() == (
        "Baggage list-member `k999` doesn't match the format "
        "(179 more like it in the last 10s not logged)"
    )
    # the Kafka client's lines are still told apart by their text (one topic, another)
    assert limiter.filter(_record("aiokafka.cluster", "Topic %s not found", "a"))
    assert limiter.filter(_record("aiokafka.cluster", "Topic %s not found", "b"))


def test_a_sidecar_line_that_comes_per_input_is_one_line_per_interval_by_template() -> None:
    """A producer's oversized records wrote ``dead letter ... truncated`` once each (170 KB
    of log per 1,000); a failing scorer, a traceback per request."""
    clock = Clock()
    limiter = RepeatFilter(interval_s=10.0, clock=clock)
    template = "lookback scoring failed for %s"

    def per_input(request_id: str) -> logging.LogRecord:
        record = _record("sidecar.pipeline", template, request_id)
        record.__dict__.update(PER_INPUT)  # what extra=PER_INPUT does
        return record

    passed = [limiter.filter(per_input(f"req-{i}")) for i in range(1_000)]
    assert passed == [True] + [False] * 999  # each request id another text: one template
    for _ in range(3):  # the same template without the mark is never held back
        assert limiter.filter(_record("sidecar.pipeline", template, "req-x"))
    clock.now += 10.0
    record = per_input("req-1000")
    assert limiter.filter(record)
    assert record.getMessage() == (
        "lookback scoring failed for req-1000 (999 more like it in the last 10s not logged)"
    )


def test_a_second_cause_of_a_per_input_failure_is_logged_while_the_first_is_held() -> None:
    """Lines were told apart by template only: a scorer failing with a ValueError per
    request held back, for 10 s, the first traceback of a new cause (a MemoryError) too,
    and the operator saw only the cause that came first."""
    clock = Clock()
    limiter = RepeatFilter(interval_s=10.0, clock=clock)

    def failing(request_id: str, error: Exception) -> logging.LogRecord:
        record = _record("sidecar.pipeline", "lookback scoring failed for %s", request_id)
        record.__dict__.update(PER_INPUT)
        try:
            raise error
        except type(error):
            record.exc_info = sys.exc_info()
        return record

    first = [limiter.filter(failing(f"a{i}", ValueError("shape"))) for i in range(50)]
    other = [limiter.filter(failing(f"b{i}", MemoryError())) for i in range(50)]
    assert first == [True] + [False] * 49
    assert other == [True] + [False] * 49  # the new cause's first line, at once
    clock.now += 10.0
    summaries = sorted(r.getMessage() for r in limiter.ended())
    assert summaries == [
        "lookback scoring failed for a0 (49 more like it (ValueError) not logged, the last "
        "10s ago)",
        "lookback scoring failed for b0 (49 more like it (MemoryError) not logged, the last "
        "10s ago)",
    ]


def test_a_per_input_line_logged_with_exc_info_but_no_exception_has_no_failure_type() -> None:
    """``log.exception`` outside an ``except`` (or ``exc_info=True`` with none in hand)
    gives ``exc_info`` ``(None, None, None)``: its type was keyed as ``NoneType``, and the
    count said "more like it (NoneType)", an exception that never was."""
    clock = Clock()
    limiter = RepeatFilter(interval_s=10.0, clock=clock)
    for i in range(3):
        record = _record("sidecar.pipeline", "no model for %s", f"r{i}")
        record.__dict__.update(PER_INPUT)
        record.exc_info = (None, None, None)
        limiter.filter(record)
    clock.now += 10.0
    assert [r.getMessage() for r in limiter.ended()] == [
        "no model for r0 (2 more like it not logged, the last 10s ago)"
    ]


def test_no_message_can_start_a_line_of_its_own() -> None:
    """A newline in a producer's text (a header, a request id) wrote a forged line:
    ``... CRITICAL sidecar.kafka: FATAL forged by a producer`` at the start of a line."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    one_line([handler])
    one_line([handler])  # once per handler
    assert [type(f) for f in handler.filters] == [OneLine]
    forged = "x\n2030-01-01 00:00:00,000 CRITICAL sidecar.kafka: FATAL forged\r\x1b[2J\u2028y"
    handler.handle(_record("sidecar.pipeline", "request %s arrived twice", forged))
    record = _record("sidecar.kafka", "publish failed: %s", "a\nb")
    try:
        _boom()
    except ValueError:
        record.exc_info = sys.exc_info()
    handler.handle(record)
    lines = stream.getvalue().splitlines()
    assert lines[0] == (
        "ERROR sidecar.pipeline: request x\\n2030-01-01 00:00:00,000 CRITICAL sidecar.kafka: "
        "FATAL forged\\r\\x1b[2J\\u2028y arrived twice"
    )
    assert lines[1] == "ERROR sidecar.kafka: publish failed: a\\nb"
    assert lines[2] == "Traceback (most recent call last):"  # a traceback keeps its lines
    assert lines[-1] == "ValueError: boom"


def test_an_exceptions_text_in_a_traceback_cannot_forge_a_line_or_colour_it() -> None:
    """A traceback kept the exception's text raw: an error quoting a producer's text
    (``ValueError(f"bad chunk {doc_id}")``) wrote a forged ``CRITICAL`` line at the start of
    a line, an ESC sequence and a right-to-left override, and a URL's password, as they
    came. Each exception's own text is one escaped, masked line now; the frames keep theirs."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    one_line([handler])
    doc_id = "d1\n2030-01-01 00:00:00,000 CRITICAL sidecar.kafka: FATAL forged\x1b[2J\u202egnp"
    url = "http://u:hunter2@judge:80/v1"
    record = _record("sidecar.pipeline", "internal error on %s", "req-1")
    try:
        _chained(KeyError(url), ValueError(f"bad chunk {doc_id}"))
    except ValueError:
        record.exc_info = sys.exc_info()
    handler.handle(record)
    text = stream.getvalue()
    lines = text.splitlines()
    assert lines[0] == "ERROR sidecar.pipeline: internal error on req-1"
    assert [line for line in lines if "CRITICAL" in line] == [
        "ValueError: bad chunk d1\\n2030-01-01 00:00:00,000 CRITICAL sidecar.kafka: FATAL "
        "forged\\x1b[2J\\u202egnp"
    ]
    assert "hunter2" not in text and "\x1b" not in text and "\u202e" not in text
    assert "The above exception was the direct cause of the following exception:" in lines
    assert sum(line.startswith("Traceback (most recent call last):") for line in lines) == 2
    assert any(line.startswith('  File "') for line in lines)  # the frames keep their lines


def test_a_note_or_a_group_member_in_a_traceback_cannot_forge_a_line() -> None:
    """The standard traceback writes each line of an exception's notes (``add_note``) as a
    line of its own, and an exception group's members behind a ``|`` margin: a note quoting
    a producer's text wrote a forged ``CRITICAL`` line at the start of a line, and a group
    member's frames ran together on one escaped line (``File ...\\n  |     raise``). A note
    is part of its exception's one line now, and a group's frames keep their lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    one_line([handler])
    forged = "2030-01-01 00:00:00,000 CRITICAL sidecar.kafka: FATAL forged"
    for group in (False, True):
        record = _record("sidecar.pipeline", "internal error on %s", "req-1")
        try:
            try:
                _boom()
            except ValueError as exc:
                exc.add_note(f"while reading doc d1\n{forged}")
                if group:
                    raise ExceptionGroup("scoring failed", [exc]) from None
                raise
        except Exception:  # the ValueError, or the group around it
            record.exc_info = sys.exc_info()
        handler.handle(record)
    lines = stream.getvalue().splitlines()
    own = f"ValueError: boom\\nwhile reading doc d1\\n{forged}"
    assert [line for line in lines if "CRITICAL" in line] == [own, f"    | {own}"]
    frames = [line.strip(" |") for line in lines if line.strip(" |").startswith("File ")]
    assert len(frames) == 5 and all("\\n" not in line for line in frames)
    assert 'raise ValueError("boom")' in [line.strip(" |") for line in lines]


def test_no_message_can_colour_or_reorder_its_line() -> None:
    """Audit: a withdrawal on ``rag.certificates`` under a certified key, its
    ``calibration_key`` a producer's text, was logged with a C1 CSI (U+009B: a colour
    or cursor sequence, ESC escaped but not it) and a right-to-left override (U+202E:
    ``x<RLO>gnp.exe`` reads ``xexe.png`` in ``kubectl logs``) as they came."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    one_line([handler])
    spoof = "x\u202egnp.exe\u202c \x9b31mred\x9b0m \u2066\u2069\u200f\u061c\x85 \u200b\U000e0041"
    handler.handle(_record("sidecar.kafka.certificates", "names %s under the key", spoof))
    assert stream.getvalue() == (
        "names x\\u202egnp.exe\\u202c \\x9b31mred\\x9b0m \\u2066\\u2069\\u200f\\u061c\\x85 "
        "\\u200b\\U000e0041 under the key\n"  # and the invisible: zero-width, a tag letter
    )
    handler.handle(_record("sidecar", "%s", "é ü 日本 ✓"))  # printable text stays as it is
    assert stream.getvalue().endswith("é ü 日本 ✓\n")


def test_the_command_line_keeps_every_message_on_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forge(args: argparse.Namespace) -> int:
        del args
        logging.getLogger("sidecar.kafka").warning("key %s", "k\nCRITICAL forged")
        logging.getLogger("opentelemetry.baggage.propagation").warning("bad %s", "member")
        return 0

    handler = _command_line(monkeypatch, forge)
    assert ("sidecar.kafka", logging.WARNING, "key k\\nCRITICAL forged") in handler.lines
    assert not any(line[0].startswith("opentelemetry.baggage") for line in handler.lines)


def _boom() -> None:
    raise ValueError("boom")


def _chained(cause: Exception, error: Exception) -> None:
    try:
        raise cause
    except type(cause) as caught:
        raise error from caught


class _NotAvailable(Exception):
    """Named as aiokafka's error is: the filter reads the rendered message."""

    def __str__(self) -> str:
        return "[Error 15] GroupCoordinatorNotAvailableError"


def test_the_coordinators_startup_retries_are_info_only_within_the_grace_period() -> None:
    """Every first start against a new cluster logged aiokafka's coordinator retries at ERROR."""
    clock = Clock()
    calm = StartupTransients(grace_s=60.0, clock=clock)
    name, msg = "aiokafka.consumer.group_coordinator", "Group Coordinator Request failed: %s"
    record = _record(name, msg, _NotAvailable())
    assert calm.filter(record)
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")
    assert record.getMessage().startswith(
        "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError (retrying"
    )
    # other failures of the same line, other lines and other loggers keep their level
    for other in (
        _record(name, msg, "[Error 29] GroupAuthorizationFailedError"),
        _record(name, "Heartbeat failed: %r", _NotAvailable()),
        _record("sidecar.kafka", msg, _NotAvailable()),
    ):
        assert calm.filter(other) and other.levelno == logging.ERROR
    clock.now += 60.0  # still no coordinator after the grace period: an error again
    late = _record(name, msg, _NotAvailable())
    assert calm.filter(late) and late.levelno == logging.ERROR
    assert (
        late.getMessage()
        == "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError"
    )


def test_faststreams_topic_warning_is_dropped_as_the_sidecar_checks_its_topics() -> None:
    calm = StartupTransients(grace_s=60.0, clock=Clock())
    text = "Auto create topics is disabled. Make sure the topics exist."
    assert not calm.filter(_record("sidecar.kafka", text, level=logging.WARNING))
    assert calm.filter(
        _record("sidecar.kafka", "Topic rag.verdicts is missing", level=logging.WARNING)
    )
    assert calm.filter(_record("faststream", text, level=logging.WARNING))  # not ours to judge


def test_a_bootstrap_server_that_does_not_answer_is_a_warning_not_an_error() -> None:
    """With a cluster's list of servers, one broker down made every client that started
    meanwhile log aiokafka's ERROR, though it bootstrapped from the next one and served."""
    calm = StartupTransients(grace_s=60.0, clock=Clock())
    msg = 'Unable connect to "%s:%s": %s'
    record = _record("aiokafka", msg, "10.0.0.7", 9093, ConnectionRefusedError(111, "refused"))
    assert calm.filter(record)
    assert (record.levelno, record.levelname) == (logging.WARNING, "WARNING")
    assert record.getMessage() == (
        'Unable connect to "10.0.0.7:9093": [Errno 111] refused '
        "(trying the next bootstrap server, if any)"
    )


class _Away(Exception):
    """Named as aiokafka's errors are: the filter reads the rendered message."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(f"{name}: {text}")


def test_a_broker_away_for_the_moment_is_a_warning_and_other_failures_stay_errors() -> None:
    """A rolling restart of a three-node cluster logged 13-23 of aiokafka's ERRORs per
    sidecar (every one retried, every request decided)."""
    calm = StartupTransients(grace_s=60.0, clock=Clock())
    closed = _Away("KafkaConnectionError", "Connection at 127.0.0.1:22802 closed")
    not_ready = _Away("NodeNotReadyError", "Attempt to send a request to node which is not ready")
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 22802)")
    coordinator = "aiokafka.consumer.group_coordinator"
    away = [
        _record("aiokafka", "Unable connect to node with id %s: %s", 1, refused),
        _record(
            "aiokafka", "Unable connect to node with id %s: %s", 1, _Away("StaleMetadata", "x")
        ),
        _record("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, closed),
        _record("aiokafka.consumer.fetcher", "Failed fetch offsets from %s: %s", 3, not_ready),
        _record(coordinator, "Group Coordinator Request failed: %s", not_ready),
        _record(coordinator, "Heartbeat send request failed: %s. Will retry.", closed),
        _record(
            coordinator,
            "Error sending %s to node %s [%s] -- marking coordinator dead",
            "OffsetCommitRequest",
            1,
            not_ready,
        ),
    ]
    for record in away:
        text = record.getMessage()
        assert calm.filter(record)
        assert (record.levelno, record.levelname) == (logging.WARNING, "WARNING"), text
        assert record.getMessage() == f"{text} (retried: a broker restarting or handing over)"
    expired = _record(coordinator, "Heartbeat session expired - marking coordinator dead")
    assert calm.filter(expired) and expired.levelno == logging.WARNING
    assert expired.getMessage().endswith("marking coordinator dead (rejoining the group)")
    denied = _Away("TopicAuthorizationFailedError", "rag.verdicts")
    for other in (
        _record("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, denied),
        _record(
            coordinator,
            "Group Coordinator Request failed: %s",
            _Away("GroupAuthorizationFailedError", "g"),
        ),
        _record("aiokafka.producer.sender", "Failed fetch messages from %s: %s", 1, closed),
        _record("aiokafka", "Unable to update metadata from %s", [1, 2, 3]),
    ):
        assert calm.filter(other) and other.levelno == logging.ERROR, other.getMessage()


def test_a_log_line_never_carries_a_credential_of_a_url() -> None:
    """Audit: the OTLP exporter logged its endpoint's query on every failed export:
    ``Max retries exceeded with url: /v1/traces?token=QTOKEN``."""
    record = _record(
        "opentelemetry.exporter",
        "Max retries exceeded with url: %s (%s)",
        "/v1/traces?token=QTOKEN&x=1",
        "https://bob:HUNTER2@otel:4318",
    )
    assert OneLine().filter(record)
    said = record.getMessage()
    assert "QTOKEN" not in said and "HUNTER2" not in said
    assert said == (
        "Max retries exceeded with url: /v1/traces?token=**********&x=1 "
        "(https://bob:**********@otel:4318)"
    )
