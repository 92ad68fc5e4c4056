"""One line per ``interval_s`` for a message the Kafka client repeats, with a count of the rest.

aiokafka logs some conditions on every attempt: ``Topic ... not found in cluster
metadata`` (at ERROR, so the WARNING floor on its loggers lets it through) came
1,500-3,000 times a second while a deleted verdict topic held records, 5 MB of
log in 30 s. ``RepeatFilter`` on the handlers lets the first of each message
through, drops the same message (logger, level, text) for ``interval_s``, and
lets the next one after that through with the number dropped meanwhile.
Records of other loggers pass untouched, but for the sidecar's own lines logged with
``extra=PER_INPUT``: those that can come once per consumed record or request (a dead
letter cut to fit the DLQ wrote 170 bytes of log per oversized record a producer sent,
170 KB per 1,000; a traceback per request while a scorer fails). When the flood stops,
no next line comes: :func:`report_repeats` (the service's ticker, and ``guardrail`` on
its way out) writes one line for each message whose interval ended with lines dropped,
so the last count is not lost.

OpenTelemetry's propagators log what they cannot parse, with the producer's text in
the message: one ``baggage`` header of 180 malformed members gave 180 WARNING lines
per verdict (audit). Its loggers are limited too, by the message's template rather
than its text, so varied junk is still one line per interval. And :class:`OneLine`
writes every record's message on one line (control characters escaped): a newline
in a producer's header or request id cannot start a forged line of the log, nor a C1
CSI or a bidirectional override colour it or show it in another order.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from sidecar.kafka_logs import demote_retried, relevel
from sidecar.redact import redact_text

REPEAT_INTERVAL_S = 10.0
THIRD_PARTY_LOGGERS = ("aiokafka", "kafka", "faststream", "opentelemetry")
# loggers whose arguments are the producers' text: one message per template, whatever text
BY_TEMPLATE = ("opentelemetry",)
MAX_KEYS = 1_000  # distinct messages remembered; windows that ended are forgotten first


_SUMMARY: Final = "repeat_summary"  # a LogRecord attribute: a count this module wrote
# a window's key: logger, level, the message (its template, or its text) and the type of
# the exception whose traceback it carries ("" without one)
_Key = tuple[str, int, str, str]
_PER_INPUT: Final = "per_input"  # a LogRecord attribute: a line that can come per input
# ``log.warning(..., extra=PER_INPUT)``: a line of the sidecar's own that a producer's
# records can repeat, one per record or request; limited by its template (its arguments
# are a request id, a size: varied junk is one line per interval all the same)
PER_INPUT: Final[Mapping[str, object]] = MappingProxyType({_PER_INPUT: True})


@dataclass(slots=True)
class _Window:
    opened: float  # when the last line of this message went through
    dropped: int = 0
    last: float = 0.0  # when the last of the dropped lines came
    where: tuple[str, int] = ("", 0)  # the file and line that logged it (not the record:
    # its args and traceback could hold anything)
    text: str = ""  # the message of the line that went through


class RepeatFilter(logging.Filter):
    """Lets a message of ``loggers`` (and their children), or one logged with
    :data:`PER_INPUT`, through once per ``interval_s``.

    Thread-safe: logging runs a handler's filters outside the handler's lock, and the
    loop, the processor thread, the judge's and the exporters' threads all log, while the
    ticker takes the counts (:meth:`ended`). Unlocked, a new message logged by one thread
    while another looked through the windows failed that one ("dictionary changed size
    during iteration", out of the ticker's tick: the ticker was gone), and counts were lost.
    """

    def __init__(
        self,
        loggers: Iterable[str] = THIRD_PARTY_LOGGERS,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._loggers = tuple(loggers)
        self._templates = tuple(n for n in BY_TEMPLATE if n in self._loggers)
        self.interval_s = interval_s
        self._clock = clock
        self._windows: dict[_Key, _Window] = {}
        self._dropping = 0  # windows with dropped > 0: ``ended`` looks only when some are
        self._lock = threading.RLock()  # over the windows and ``_dropping``
        self._inside = False  # a thread is in :meth:`_held` (read and written under the lock)

    def _limited(self, name: str) -> bool:
        return any(_under(name, n) for n in self._loggers)

    def filter(self, record: logging.LogRecord) -> bool:
        per_input = getattr(record, _PER_INPUT, False)
        if not (per_input or self._limited(record.name)) or getattr(record, _SUMMARY, False):
            return True
        text = record.getMessage()
        by_template = per_input or any(_under(record.name, n) for n in self._templates)
        # a traceback's exception type is part of what the line says: a scorer failing on
        # a second cause while the first one's lines are held back is logged at once
        exc = record.exc_info[1] if record.exc_info else None  # (None, None, None): none
        failure = "" if exc is None else type(exc).__qualname__
        key = (record.name, record.levelno, str(record.msg) if by_template else text, failure)
        with self._held() as first:
            if not first:
                return True  # logged from inside this filter, on its own thread: see ``_held``
            now = self._clock()
            window = self._windows.get(key)
            if window is not None and now - window.opened < self.interval_s:
                self._dropping += window.dropped == 0
                window.dropped += 1
                window.last = now
                return False
            if window is not None and window.dropped:
                self._dropping -= 1
                record.msg = _counted(text, window.dropped, now - window.opened)
                record.args = None
            if len(self._windows) >= MAX_KEYS:
                self._forget(now)
            self._windows[key] = _Window(now, where=(record.pathname, record.lineno), text=text)
        return True

    def ended(self, *, every: bool = False) -> list[logging.LogRecord]:
        """A line for each message whose interval ended with lines dropped (``every``: each
        message with lines dropped, ended or not), with the count; those messages are
        forgotten (the next line of one goes through as a first)."""
        with self._held() as first:
            if not first or not self._dropping:
                return []
            now = self._clock()
            done = [
                key
                for key, window in self._windows.items()
                if window.dropped and (every or now - window.opened >= self.interval_s)
            ]
            out: list[logging.LogRecord] = []
            for key in done:  # forgotten: the message's next line goes through at once
                out.append(_summary(key, self._windows.pop(key), now))
                self._dropping -= 1
            return out

    @contextlib.contextmanager
    def _held(self) -> Iterator[bool]:
        """The lock, and whether this thread holds it for the first time (False: a line
        logged from inside the filter, which goes through uncounted).

        Such a line comes from a finalizer the garbage collector runs in the middle of an
        allocation on the thread that holds the lock (aiokafka's and asyncio's ``__del__``
        log an unclosed connection); waiting on the lock its own thread held, that thread
        (the event loop's) hung for good. The lock is reentrant, and the flag is read under
        it: a thread ident noted after the lock was taken and cleared before it was let go
        left both ends out, and a collection run by the lock's own ``__exit__`` (it
        allocates its arguments' tuple) still hung the thread (a repeatable test)."""
        with self._lock:
            if self._inside:
                yield False
                return
            self._inside = True
            try:
                yield True
            finally:
                self._inside = False

    def _forget(self, now: float) -> None:  # under the lock
        ended = [k for k, w in self._windows.items() if now - w.opened >= self.interval_s]
        for key in ended or list(self._windows)[: MAX_KEYS // 2]:
            self._dropping -= self._windows.pop(key).dropped > 0


def _under(name: str, logger: str) -> bool:
    """``name`` is ``logger`` or one of its children."""
    return name == logger or name.startswith(logger + ".")


def _counted(text: str, dropped: int, seconds: float) -> str:
    return f"{text} ({dropped} more like it in the last {seconds:.0f}s not logged)"


def _summary(key: _Key, window: _Window, now: float) -> logging.LogRecord:
    """The count of a message's dropped lines, as a record of its logger, level and line."""
    name, level, _, failure = key
    path, line = window.where
    # written after the flood ended: said as past, with when the last line came (audit: an
    # ERROR count written 8 s after "broker reachable" read as a new failure)
    like = f"more like it ({failure})" if failure else "more like it"
    counted = (
        f"{window.text} ({window.dropped} {like} not logged, the last {now - window.last:.0f}s ago)"
    )
    record = logging.LogRecord(name, level, path, line, counted, None, None)
    setattr(record, _SUMMARY, True)
    return record


def report_repeats(handlers: Iterable[logging.Handler], *, every: bool = False) -> int:
    """Write the counts :meth:`RepeatFilter.ended` holds to the handler each filter is on
    (``every``: also the intervals still running, at exit); how many lines were written."""
    written = 0
    for handler in handlers:
        for limiter in handler.filters:
            if isinstance(limiter, RepeatFilter):
                for record in limiter.ended(every=every):
                    handler.handle(record)
                    written += 1
    return written


def limit_repeats(
    handlers: Iterable[logging.Handler], interval_s: float = REPEAT_INTERVAL_S
) -> None:
    """Put one ``RepeatFilter`` on each of ``handlers`` (the root logger's, once configured)."""
    for handler in handlers:
        if not any(isinstance(f, RepeatFilter) for f in handler.filters):
            handler.addFilter(RepeatFilter(interval_s=interval_s))


# aiokafka logs at ERROR, and retries, while a fresh broker is still creating the group
# coordinator (its __consumer_offsets partitions): every first start of a sidecar against
# a new cluster printed several ERROR lines that meant "retrying" (audit). Within the
# grace period they are INFO; a coordinator still missing after it is an ERROR again.
STARTUP_GRACE_S: Final = 60.0
STARTUP_TRANSIENTS: Final = (
    ("aiokafka.consumer.group_coordinator", "Group Coordinator Request failed: ", (
        "GroupCoordinatorNotAvailableError", "CoordinatorNotAvailableError",
        "CoordinatorLoadInProgressError", "NotCoordinatorForGroupError",
    )),
)  # fmt: skip


# FastStream's WARNING on every start (the sidecar does not let it create topics); the
# sidecar checks its topics itself before it subscribes, and says what it found
REDUNDANT: Final = (
    ("sidecar.kafka", "Auto create topics is disabled. Make sure the topics exist."),
)


class StartupTransients(logging.Filter):
    """The client's "coordinator not available yet" lines of the first ``grace_s``, at INFO;
    FastStream's start-up warning about topics the sidecar has checked (dropped); a
    bootstrap server that does not answer, a broker the client cannot reach for the moment
    and a group session that expired, at WARNING
    (:data:`sidecar.kafka_logs.DEMOTIONS`, which the client's opt-in shares)."""

    def __init__(
        self, grace_s: float = STARTUP_GRACE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._clock = clock
        self._until = clock() + grace_s

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.INFO:
            return True
        line = (record.name, record.msg)
        if line in REDUNDANT:
            return False
        if demote_retried(record):
            return True
        for name, prefix, errors in STARTUP_TRANSIENTS:
            if record.name != name or not str(record.msg).startswith(prefix):
                continue
            text = record.getMessage()
            if any(error in text for error in errors) and self._clock() < self._until:
                note = "retrying: usual while a new cluster starts its group coordinator"
                relevel(record, logging.INFO, f"{text} ({note})")
        return True


def calm_startup(handlers: Iterable[logging.Handler], grace_s: float = STARTUP_GRACE_S) -> None:
    """Put one :class:`StartupTransients` on each of ``handlers`` (before any other filter)."""
    for handler in handlers:
        if not any(isinstance(f, StartupTransients) for f in handler.filters):
            handler.filters.insert(0, StartupTransients(grace_s))


def printable(text: str) -> str:
    """``text`` with each character that is not printable written as ``repr`` writes it:
    C0 and C1 controls (a newline; U+009B, a CSI as ESC [ is), line separators, the
    bidirectional controls (a right-to-left override made ``x<RLO>gnp.exe`` read
    ``xexe.png``: audit), zero-width and other invisible format characters."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class OneLine(logging.Filter):
    """Every record's message on one line: characters that are not printable written as
    escapes (:func:`printable`), and credentials in URLs masked
    (:func:`~sidecar.redact.redact_text`).

    The message is rendered once here (``msg`` becomes the text, ``args`` None);
    a traceback keeps its lines, and each exception's own text in it is one line, escaped
    and masked as a message is (:func:`_traceback_text`).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        text = redact_text(record.getMessage())  # an exporter's endpoint with ?token=...
        record.msg = printable(text)
        record.args = None
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and not record.exc_text:  # the formatter uses exc_text as given
            record.exc_text = _traceback_text(exc)
        return True


def _traceback_text(exc: BaseException) -> str:
    """The standard traceback of ``exc``, with each exception's own text (``Type: message``,
    its notes) on one line, escaped and masked as a message is: a newline in it (a
    producer's text quoted in an error) cannot start a forged line of its own.

    The text is escaped where the traceback module makes it (``format_exception_only`` of
    each exception in the chain and in a group), not picked out of the output afterwards:
    the module writes each line of a note as a line of its own, and a group member's frames
    behind a ``|`` margin, so neither can be told from the layout there."""
    root = traceback.TracebackException.from_exception(exc)
    nodes = [root]
    while nodes:
        node = nodes.pop()
        own = printable(redact_text("".join(node.format_exception_only()).removesuffix("\n")))
        node.format_exception_only = _said(own)  # type: ignore[method-assign]
        linked = (node.__cause__, node.__context__, *(node.exceptions or ()))
        nodes += [n for n in linked if n is not None]
    lines = "".join(root.format()).removesuffix("\n").split("\n")
    return "\n".join(printable(line) for line in lines)  # the frames' own lines


def _said(line: str) -> Callable[..., Generator[str, None, None]]:
    """An exception's ``format_exception_only`` that gives its one escaped ``line``."""

    def format_exception_only(*_: object, **__: object) -> Generator[str, None, None]:
        yield f"{line}\n"

    return format_exception_only


def one_line(handlers: Iterable[logging.Handler]) -> None:
    """Put one :class:`OneLine` on each of ``handlers`` (after any other filter)."""
    for handler in handlers:
        if not any(isinstance(f, OneLine) for f in handler.filters):
            handler.addFilter(OneLine())
