"""One line per ``interval_s`` for a message the Kafka client repeats, with a count of the rest.

aiokafka logs some conditions on every attempt: ``Topic ... not found in cluster
metadata`` (at ERROR, so the WARNING floor on its loggers lets it through) came
1,500-3,000 times a second while a deleted verdict topic held records, 5 MB of
log in 30 s. ``RepeatFilter`` on the handlers lets the first of each message
through, drops the same message (logger, level, text) for ``interval_s``, and
lets the next one after that through with the number dropped meanwhile.
Records of other loggers pass untouched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

REPEAT_INTERVAL_S = 10.0
THIRD_PARTY_LOGGERS = ("aiokafka", "kafka", "faststream")
MAX_KEYS = 1_000  # distinct messages remembered; windows that ended are forgotten first


@dataclass(slots=True)
class _Window:
    opened: float  # when the last line of this message went through
    dropped: int = 0


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

    def _limited(self, name: str) -> bool:
        return any(name == n or name.startswith(n + ".") for n in self._loggers)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._limited(record.name):
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.opened < self.interval_s:
            window.dropped += 1
            return False
        if window is not None and window.dropped:
            record.msg = (
                f"{key[2]} ({window.dropped} more like it in the last "
                f"{now - window.opened:.0f}s not logged)"
            )
            record.args = None
        if len(self._windows) >= MAX_KEYS:
            self._forget(now)
        self._windows[key] = _Window(now)
        return True

    def _forget(self, now: float) -> None:
        ended = [k for k, w in self._windows.items() if now - w.opened >= self.interval_s]
        for key in ended or list(self._windows)[: MAX_KEYS // 2]:
            del self._windows[key]


def limit_repeats(
    handlers: Iterable[logging.Handler], interval_s: float = REPEAT_INTERVAL_S
) -> None:
    """Put one ``RepeatFilter`` on each of ``handlers`` (the root logger's, once configured)."""
    for handler in handlers:
        if not any(isinstance(f, RepeatFilter) for f in handler.filters):
            handler.addFilter(RepeatFilter(interval_s=interval_s))
