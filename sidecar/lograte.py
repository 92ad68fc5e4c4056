"""One line per ``interval_s`` for a message the Kafka client repeats, with a count of the rest.

aiokafka logs some conditions on every attempt: ``Topic ... not found in cluster
metadata`` (at ERROR, so the WARNING floor on its loggers lets it through) came
1,500-3,000 times a second while a deleted verdict topic held records, 5 MB of
log in 30 s. ``RepeatFilter`` on the handlers lets the first of each message
through, drops the same message (logger, level, text) for ``interval_s``, and
lets the next one after that through with the number dropped meanwhile.
Records of other loggers pass untouched. When the flood stops, no next line comes:
:func:`report_repeats` (the service's ticker, and ``guardrail`` on its way out) writes
one line for each message whose interval ended with lines dropped, so the last count
is not lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

REPEAT_INTERVAL_S = 10.0
THIRD_PARTY_LOGGERS = ("aiokafka", "kafka", "faststream")
MAX_KEYS = 1_000  # distinct messages remembered; windows that ended are forgotten first


_SUMMARY: Final = "repeat_summary"  # a LogRecord attribute: a count this module wrote


@dataclass(slots=True)
class _Window:
    opened: float  # when the last line of this message went through
    dropped: int = 0
    where: tuple[str, int] = ("", 0)  # the file and line that logged it (not the record:
    # its args and traceback could hold anything)


class RepeatFilter(logging.Filter):
    """Lets a message of ``loggers`` (and their children) through once per ``interval_s``."""

    def __init__(
        self,
        loggers: Iterable[str] = THIRD_PARTY_LOGGERS,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._loggers = tuple(loggers)
        self.interval_s = interval_s
        self._clock = clock
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._dropping = 0  # windows with dropped > 0: ``ended`` looks only when some are

    def _limited(self, name: str) -> bool:
        return any(name == n or name.startswith(n + ".") for n in self._loggers)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._limited(record.name) or getattr(record, _SUMMARY, False):
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.opened < self.interval_s:
            self._dropping += window.dropped == 0
            window.dropped += 1
            return False
        if window is not None and window.dropped:
            self._dropping -= 1
            record.msg = _counted(key[2], window.dropped, now - window.opened)
            record.args = None
        if len(self._windows) >= MAX_KEYS:
            self._forget(now)
        self._windows[key] = _Window(now, where=(record.pathname, record.lineno))
        return True

    def ended(self, *, every: bool = False) -> list[logging.LogRecord]:
        """A line for each message whose interval ended with lines dropped (``every``: each
        message with lines dropped, ended or not), with the count; those messages are
        forgotten (the next line of one goes through as a first)."""
        if not self._dropping:
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

    def _forget(self, now: float) -> None:
        ended = [k for k, w in self._windows.items() if now - w.opened >= self.interval_s]
        for key in ended or list(self._windows)[: MAX_KEYS // 2]:
            self._dropping -= self._windows.pop(key).dropped > 0


def _counted(text: str, dropped: int, seconds: float) -> str:
    return f"{text} ({dropped} more like it in the last {seconds:.0f}s not logged)"


def _summary(key: tuple[str, int, str], window: _Window, now: float) -> logging.LogRecord:
    """The count of a message's dropped lines, as a record of its logger, level and line."""
    name, level, text = key
    path, line = window.where
    counted = _counted(text, window.dropped, now - window.opened)
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
